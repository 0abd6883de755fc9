"""Model level: what the model probe measures of an erased subject before erasure, after suppression and after
the shard's retrain, next to its two nulls; the shard retrain against retraining every shard (SISA); the
probe's cost.

A deployment of 16 people (8 sentences each, the last a canary with a six-digit secret; 4 held out), a
2-layer GPT-2 over bytes (the default ``ModelConfig``: 128 wide, 446k parameters; the tests train
``ModelConfig.ci()``, 64 wide) with a base trained on other people's sentences, and 4 LoRA shards (rank 32
on attention and MLP, 700 steps). One subject per shard is erased
through the adapter, one after another: measured with the shard serving (before), with the ensemble
recomposed without it (after suppression) and with it retrained without the subject (after reclaim).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

HEADINGS = ("Model level: sharded LoRA adapters, before and after erasure",)
SUBJECTS = 16
HOLDOUT = 4
SHARDS = 4


def _ci(values: list[float], seed: int) -> tuple[float, float, float]:
    """Mean over subjects with a 95% percentile bootstrap interval (scipy.stats.bootstrap)."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if len(data) < 2 or np.all(data == data[0]):
        return float(np.mean(data)), float(np.mean(data)), float(np.mean(data))
    res = bootstrap((data,), np.mean, n_resamples=2000, confidence_level=0.95, method="percentile",
                    random_state=np.random.default_rng(seed))
    return float(np.mean(data)), float(res.confidence_interval.low), float(res.confidence_interval.high)


def run(tmp: Path, config=None, subjects: int = SUBJECTS) -> dict:
    from tombstone_adapters.lora import ModelConfig
    from tombstone_adapters.lora import synthetic as S
    from tombstone_adapters.lora.adapter import LoraAdapter

    from tombstone import Tombstone
    from tombstone.config import load_config
    from tombstone.verify import model as mv

    config = config or ModelConfig()
    root = tmp / "deploy"
    start = time.perf_counter()
    built = S.build_deployment(root, subjects=subjects, shards=SHARDS, holdout_subjects=HOLDOUT, config=config)
    build_seconds = time.perf_counter() - start
    shard_seconds = {name: s["trained"]["seconds"] for name, s in built["trained"]["shards"].items()}
    adapter = LoraAdapter("model", {"path": str(root / "stores/model")})
    stages: dict[str, list[dict]] = {"before": [], "suppressed": [], "reclaimed": []}
    retrain, probe_seconds, chosen = [], [], {}
    with Tombstone(load_config(root / "tombstone.toml")) as tomb:
        adapter.content_key = tomb.secret.content_key
        reg = adapter.model.registry()
        for shard, entry in sorted(reg["shards"].items()):  # the first subject of each shard
            ref = next(r for r in built["examples"] if built["examples"][r][0] in entry["examples"])
            chosen[shard] = ref
        for shard, ref in chosen.items():
            arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(ref)) if a.store == "model"]
            material = adapter.model_material(arts)
            examples = [{"id": a.artifact_id, "text": material[a.artifact_id]["text"],
                         "canary": material[a.artifact_id]["canary"]} for a in arts]
            seed = mv.seed_for("model", *sorted(a.artifact_id for a in arts))
            t = time.perf_counter()
            stages["before"].append(mv.measure(adapter.model_target(), examples, [shard], seed, with_owners=True))
            probe_seconds.append(time.perf_counter() - t)
            adapter.suppress(arts)
            stages["suppressed"].append(mv.measure(adapter.model_target(), examples, [shard], seed))
            t = time.perf_counter()
            evidence = adapter.reclaim(arts)
            retrain.append(time.perf_counter() - t)
            assert evidence["retrained"][shard]["weights_changed"], evidence
            stages["reclaimed"].append(mv.measure(adapter.model_target(), examples, [shard], seed))
    params = _parameters(config)
    return {"config": config.to_dict(), "parameters": params, "subjects": subjects, "holdout": HOLDOUT,
            "shards": SHARDS, "erased": len(chosen), "build_seconds": build_seconds,
            "base_seconds": built["base"]["trained"]["seconds"], "shard_seconds": shard_seconds,
            "retrain_seconds": retrain, "probe_seconds": probe_seconds, "stages": stages}


def _parameters(config) -> dict:
    from tombstone_adapters.lora import model as M

    base = M.build_base(config)
    total = sum(p.numel() for p in base.parameters())
    state, _ = M.train_adapter(config, base, ["x"], seed=0, steps=0)
    return {"base": total, "lora_per_shard": sum(v.numel() for v in state.values())}


def _tpr(measures: list[dict], name: str, key: str, seed: int) -> str:
    """The mean TPR at the low FPR over subjects (``key``: ``tpr`` served, ``null_suppressed`` the null)."""
    values = [m[name]["tpr_at_fpr"][key] for m in measures if (m[name].get("tpr_at_fpr") or {}).get(key) is not None]
    if not values:
        return "-"
    mean, low, high = _ci(values, seed)
    return f"{mean:.2f} ({low:.2f}-{high:.2f})"


def _told(measures: list[dict]) -> str:
    """How many subjects the measurement separated / did not / could not tell."""
    outcomes = [m.get("outcome") or ("separated" if m["separates"] else "not separated") for m in measures]
    return " / ".join(str(outcomes.count(o)) for o in ("separated", "not separated", "cannot tell"))


def _row(label: str, measures: list[dict], seed: int) -> str:
    cells = []
    for name in ("loss", "min_k"):
        auc = _ci([m[name]["auc"] for m in measures], seed)
        null_s = _ci([m[name]["null_suppressed"] for m in measures], seed + 1)
        null_h = _ci([m[name]["null_heldout"] for m in measures if m[name]["null_heldout"] is not None], seed + 2)
        cells += [f"{auc[0]:.2f} ({auc[1]:.2f}-{auc[2]:.2f})", f"{null_s[0]:.2f} / {null_h[0]:.2f}",
                  f"{_tpr(measures, name, 'tpr', seed + 4)} / {_tpr(measures, name, 'null_suppressed', seed + 5)}"]
    canaries = [c for m in measures for c in m.get("canaries", {}).values()]
    if canaries:
        exp = _ci([c["exposure"] for c in canaries], seed + 3)
        null_exp = statistics.mean(c["null_suppressed"]["exposure"] for c in canaries)
        held_exp = statistics.mean(c["null_heldout"]["exposure"] for c in canaries)
        cells += [", ".join(str(r) for r in sorted(c["rank"] for c in canaries)),
                  f"{exp[0]:.1f} ({exp[1]:.1f}-{exp[2]:.1f})", f"{null_exp:.1f} / {held_exp:.1f}"]
    else:
        cells += ["-", "-", "-"]
    power = sorted({m["loss"].get("detectable_auc") for m in measures if "loss" in m} - {None})
    cells += [f"{sum(c['greedy_extracted'] for c in canaries)} of {len(canaries)}",
              ", ".join(f"{p:.2f}" for p in power) or "none", _told(measures)]
    return f"| {label} | " + " | ".join(cells) + " |"


def _sizes(result: dict) -> str:
    """The sample sizes the AUCs were measured at."""
    from tombstone.verify.model_stats import ALPHA, plural

    sizes = sorted({(m["examples"], m["held_out_examples"]) for stage in result["stages"].values() for m in stage})
    return (", ".join(f"{plural(n, 'example')} against {m} held-out" for n, m in sizes)
            + f"; one-sided alpha {ALPHA:g}")


def _mean(result: dict, stage: str, metric: str, key: str) -> float:
    return statistics.mean(m[metric][key] for m in result["stages"][stage])


def _spread(result: dict, metric: str, key: str) -> str:
    values = [m[metric][key] for stage in result["stages"].values() for m in stage if m[metric][key] is not None]
    return f"{min(values):.2f} to {max(values):.2f}"


def section(result: dict) -> str:
    cfg = result["config"]
    one = statistics.median(result["retrain_seconds"])
    all_shards = sum(result["shard_seconds"].values())
    lines = [
        f"## {HEADINGS[0]}",
        "",
        (f"A 2-layer GPT-2 over bytes ({cfg['n_embd']} wide, {result['parameters']['base']:,} parameters, 259-token"
        f" vocabulary) built from a local configuration, its base trained on other people's sentences"
        f" ({cfg['base_steps']} steps), then {result['shards']} LoRA shards (rank {cfg['lora_r']} on attention and MLP,"
        f" {result['parameters']['lora_per_shard']:,} parameters each, {cfg['steps']} steps at lr {cfg['lr']:g} with"
        f" warmup and decay) over {result['subjects']} people with 8 sentences each, the last a canary with a six-digit"
        f" secret; {result['holdout']} people held out of every shard. The serving ensemble is the renormalised mean of"
        f" the shards' next-token log-probabilities. One subject per shard ({result['erased']} in all) erased through the"
        " adapter, one after another; each measured with its shard serving (*before*), with the ensemble recomposed"
        " without it (*suppressed*) and with the shard retrained without the subject (*reclaimed*)."),
        "",
        ("Means over the erased subjects with 95% bootstrap intervals over subjects. AUC: the subject's 8 examples"
        " against the held-out people's 32 by loss and by Min-K% (k = 20%); the nulls are the suppressed ensemble"
        " (the shards that never saw the subject) and one held-out person scored the same way against the other"
        " held-out people. Canary: the rank of the true secret among 1,000 (999 random six-digit secrets), its"
        " exposure in bits (log2 1000 - log2 rank, at most 9.97), and the nulls' exposures (the suppressed ensemble;"
        " a fresh secret never trained on after the same prefix). *Separates*: the probe's decision (an AUC whose"
        " lower bound is above both nulls, or a canary above both nulls with rank p at most 0.01 whose gain over"
        " the suppressed ensemble also ranks in the top 1%, or one greedy decoding completes and the suppressed"
        " ensemble does not). Each measure is three-valued: it separates the subject, does not, or cannot tell"
        " (too few samples for its statistic); the last column counts subjects separated / not separated / cannot"
        " tell. *TPR at 5% FPR*: the share of the subject's examples scored above the lowest threshold that at most"
        " 5% of the held-out examples exceed, served model / suppressed ensemble (the null), means over subjects"
        f" with 95% bootstrap intervals. *Power*: the smallest AUC whose exact one-sided Mann-Whitney p-value"
        f" reaches the decision's alpha at the sample sizes ({_sizes(result)}; none: too few samples for any); the"
        " decision compares with the nulls, so an AUC below it can never separate."),
        "",
        ("| stage | loss AUC (CI) | loss nulls: suppressed / held-out | loss TPR at 5% FPR: served / null |"
        " Min-K% AUC (CI) | Min-K% nulls | Min-K% TPR at 5% FPR | canary ranks | exposure, bits (CI) |"
        " exposure nulls | greedy completes the canary | power: smallest detectable AUC |"
        " separated / not / cannot tell |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        _row("before erasure", result["stages"]["before"], 1),
        _row("after suppression", result["stages"]["suppressed"], 11),
        _row("after reclaim", result["stages"]["reclaimed"], 21),
        "",
        "| training | seconds |",
        "|---|---|",
        f"| base model | {result['base_seconds']:.1f} |",
        f"| one shard (median of {len(result['retrain_seconds'])} retrains in the reclaim) | {one:.1f} |",
        f"| all {result['shards']} shards (the initial training) | {all_shards:.1f} |",
        f"| SISA speed-up of an erasure (all shards / one shard) | {all_shards / one:.1f}x |",
        (f"| the model probe of one subject (median of {len(result['probe_seconds'])}; 1,001 canary candidates, 40"
        f" texts, {result['shards']} shards) | {statistics.median(result['probe_seconds']):.1f} |"),
        "",
        (f"A model that never saw a subject still tells that person's sentences from other people's: the suppressed"
        f" ensemble scores a loss AUC of {_mean(result, 'before', 'loss', 'null_suppressed'):.2f} on average (per"
        f" subject {_spread(result, 'loss', 'null_suppressed')}), held-out people"
        f" {_spread(result, 'loss', 'null_heldout')}, which is why the probe compares with these nulls and never"
        " with 0.5. Through the ensemble, greedy decoding completed"
        f" {sum(c['greedy_extracted'] for m in result['stages']['before'] for c in m.get('canaries', {}).values())}"
        f" of {result['erased']} canaries before erasure (the shards that never saw the subject outvote the one that"
        " did), while the true secret ranked in the top 1% for"
        f" {sum(c['rank'] / c['of'] <= 0.01 for m in result['stages']['before'] for c in m.get('canaries', {}).values())}"
        f" of them. The retrain reads the dataset's current version and"
        " trains from the base, so the reclaim time is one shard's training plus reading the examples; timings are"
        " on two shared CPU cores, and the probe's time is one subject's measurement (the saga takes it twice:"
        " before suppression, the control, and after the reclaim)."),
    ]
    return "\n".join(lines)
