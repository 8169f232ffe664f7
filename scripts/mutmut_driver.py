"""mutmut as scripts/mutation.py runs it: its command line, with two additions.

    GPUSHARE_MUTMUT_OVERRIDES='{"only_mutate": [...], ...}' python mutmut_driver.py ARGS

The [tool.mutmut] settings named in GPUSHARE_MUTMUT_OVERRIDES (JSON) replace
pyproject.toml's for this run: mutmut reads its settings from nowhere else, and a run of
one change mutates only the modules changed and runs only the tests that import them
(scripts/mutation.py picks both).

    python mutmut_driver.py prepare MAX_CHILDREN

makes the mutants and maps each function to the tests that reach it (mutmut's stats
run), runs no mutant: the first steps of `mutmut run`, so that scripts/mutation.py can
see every mutant and what its tests cost before it picks the ones to run. The
`mutmut run` that follows finds both kept and goes straight to the mutants.

This uses mutmut's own functions for those steps (mutmut 3.8: `mutmut run` has no
switch to stop after them); a mutmut that renamed them fails here, loudly.
"""

import json
import os
import sys
from types import ModuleType

from mutmut import configuration


def main() -> None:
    settings = configuration.config()
    for key, value in json.loads(os.environ.get("GPUSHARE_MUTMUT_OVERRIDES", "{}")).items():
        if not hasattr(settings, key):
            sys.exit(f"mutmut has no setting {key!r}")
        setattr(settings, key, value)
    # Imported after the settings are replaced: it reads them as it loads, and the
    # processes it forks inherit them.
    import mutmut.__main__ as mutmut

    if sys.argv[1:2] == ["prepare"]:
        prepare(mutmut, int(sys.argv[2]))
    else:
        mutmut.cli(sys.argv[1:], prog_name="mutmut")


def prepare(mutmut: ModuleType, max_children: int) -> None:
    """`mutmut run` (mutmut/__main__.py, _run) up to its first mutant."""
    mutmut.set_mutant_under_test("mutant_generation")
    os.makedirs("mutants", exist_ok=True)
    with mutmut.CatchOutput(spinner_title="Generating mutants"):
        mutmut.copy_src_dir()
        mutmut.copy_also_copy_files()
        mutmut.setup_source_paths()
        mutmut.store_lines_covered_by_tests()
        mutmut.create_mutants(max_children)
    mutmut.collect_or_load_stats(
        mutmut.get_mutant_runner(max_children), apply_config_invalidation=True
    )


if __name__ == "__main__":
    main()
