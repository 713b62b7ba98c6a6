"""``python -m sglang_hvd.launch_server``: SGLang's server with Hybrid Verified Decoding.

A thin door. Everything that knows SGLang lives in ``sglang_hvd.patches`` (this
package's SGLang side); the runtime core never imports it. The door finds the launcher
through the entry point that the package registers (group ``sglang_hvd.launchers``,
name ``launch_server``) and hands it the command line: its ``--help`` lists the HVD
flags and SGLang's own.
"""

from __future__ import annotations

import sys
from importlib import metadata

ENTRY_POINT_GROUP = "sglang_hvd.launchers"


def main(argv: list[str] | None = None) -> int:
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "launch_server"]
    if not found:
        print(f"sglang_hvd.launch_server: error: no {ENTRY_POINT_GROUP!r} entry point named 'launch_server'; "
              "reinstall sglang-hvd with the sglang extra: pip install '.[sglang]' in the sglang-hvd checkout",
              file=sys.stderr)
        return 2
    return found[0].load()(argv)


if __name__ == "__main__":
    sys.exit(main())
