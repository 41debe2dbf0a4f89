"""Print CI's cost table: ``python .ci/timings.py TIMINGS_FILE INSTALL_S TESTS_S``.

TIMINGS_FILE holds one JSON line per engine tier part, written by tests/engines/test_tiers.py
(``ATTNHAL_TIER_TIMINGS``). The tiers run inside the test command beside the rest of the suite
(two xdist workers), so their times overlap the total; "env" is ``built`` on a cold machine
(no cached engine environment) and ``reused`` on a warm one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def main(path: str, install_s: str, tests_s: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    print("\nCI cost (m:ss)")
    print(f"  {'part':<22}{'env':<9}{'env time':>9}{'run time':>10}")
    print(f"  {'venv + install':<22}{'built':<9}{_minutes(float(install_s)):>9}{'':>10}")
    for row in sorted(rows, key=lambda r: r["part"]):
        mark = "" if row.get("exit") == 0 else f"  (exit {row.get('exit')})"
        print(f"  {'tier ' + row['part']:<22}{row['env']:<9}{_minutes(row['env_s']):>9}"
              f"{_minutes(row['tier_s']):>10}{mark}")
    print(f"  {'test command (all)':<22}{'':<9}{'':>9}{_minutes(float(tests_s)):>10}")
    print(f"  {'total':<22}{'':<9}{'':>9}{_minutes(float(install_s) + float(tests_s)):>10}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
