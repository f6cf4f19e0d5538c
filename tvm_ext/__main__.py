"""``python -m tvm_ext``: see ``tvm_ext.cli``."""
import sys

from tvm_ext.cli import main

sys.exit(main())
