"""The SGLang suite: real SGLang servers on the CPU, through sglang_hvd.harness (harness/)."""

import os

# The checkout: launch/ scripts run from here, and ../shared/data sits beside it.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
