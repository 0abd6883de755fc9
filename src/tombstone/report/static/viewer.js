// The viewer's page logic: verify a dropped receipt in this browser and by the server, side by side, and
// check the sealed copy shown on a receipt's page. Everything is written with textContent, never as HTML.
"use strict";
(function () {
  const V = window.TombstoneVerify;
  const page = document.body.dataset;
  let trustedRaw = V.b64decode(page.publicKey);
  let trustedLabel = "the deployment's key";

  function show(box, verdict, lines) {
    box.classList.remove("pass", "fail", "pending");
    box.classList.add(verdict === true ? "pass" : verdict === false ? "fail" : "pending");
    const head = box.querySelector(".verdict");
    head.textContent = verdict === true ? "PASS" : verdict === false ? "FAIL" : "checking\u2026";
    const body = box.querySelector(".lines");
    body.replaceChildren();
    for (const line of lines) {
      const p = document.createElement("div");
      p.textContent = line;
      body.appendChild(p);
    }
  }

  async function inBrowser(box, text) {
    show(box, null, []);
    const r = await V.verifyReceipt(text, trustedRaw);
    const lines = [r.message, "against " + trustedLabel + " " + (await V.keyIdOf(trustedRaw))];
    if (r.subject !== null) lines.push("subject: " + r.subject + (r.sequence ? ", receipt #" + r.sequence : ""));
    show(box, r.ok, lines);
    box.dataset.stage = r.stage;
    return r;
  }

  async function byServer(box, text) {
    show(box, null, []);
    try {
      const response = await fetch("/api/verify", {
        method: "POST", body: text, credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Tombstone-Token": page.token },
      });
      const r = await response.json();
      const lines = [r.message];
      if (r.subject) lines.push("subject: " + r.subject + (r.sequence ? ", receipt #" + r.sequence : ""));
      if (r.chain) lines.push(r.chain);
      show(box, r.ok === true, lines);
      box.dataset.stage = r.stage || "";
    } catch (err) {
      show(box, false, ["the server could not be asked: " + err]);
    }
  }

  async function checkText(text, name) {
    const panel = document.getElementById("drop-result");
    panel.hidden = false;
    document.getElementById("drop-name").textContent = name;
    await Promise.all([inBrowser(document.getElementById("check-browser"), text),
                       byServer(document.getElementById("check-server"), text)]);
    panel.dataset.done = "1";
  }

  const drop = document.getElementById("drop");
  if (drop) {
    const input = document.getElementById("drop-file");
    const take = async (files) => { if (files && files[0]) await checkText(await files[0].text(), files[0].name); };
    drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); take(e.dataTransfer.files); });
    // cleared after each check, so choosing the same file again (after editing it) checks it again
    input.addEventListener("change", async () => { await take(input.files); input.value = ""; });
    const keyInput = document.getElementById("key-file");
    keyInput.addEventListener("change", async () => {
      const label = document.getElementById("key-label");
      if (!keyInput.files[0]) return;
      try {
        trustedRaw = V.rawFromPem(await keyInput.files[0].text());
        trustedLabel = "your key";
        label.textContent = "in-browser checks use your key " + (await V.keyIdOf(trustedRaw));
      } catch (err) {
        label.textContent = "that file is " + err.message + "; still using the deployment's key";
      }
    });
  }

  const sealed = document.getElementById("sealed-receipt");
  if (sealed) {
    inBrowser(document.getElementById("check-sealed"), JSON.parse(sealed.textContent))
      .then(() => { document.getElementById("check-sealed").dataset.done = "1"; });
  }
})();
