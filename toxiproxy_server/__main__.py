import sys

from toxiproxy_server import main

sys.exit(main())
