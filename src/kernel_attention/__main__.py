import sys

from kernel_attention.cli import main

sys.exit(main())
