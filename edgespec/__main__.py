from edgespec.cli import main

raise SystemExit(main())
