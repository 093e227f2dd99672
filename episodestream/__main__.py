from episodestream.tools.cli import main

raise SystemExit(main())
