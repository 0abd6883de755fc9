from tombstone.cli import main

main()
