from provision.cli import main

raise SystemExit(main())
