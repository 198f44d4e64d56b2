"""absl flags are one global namespace: every module of ssmgate must import beside every other (a
pytest worker imports many), so no two may define the same flag name."""
import importlib
import pkgutil

import ssmgate


def test_every_module_imports_beside_every_other():
    failed = {}
    for module in pkgutil.walk_packages(ssmgate.__path__, "ssmgate."):
        if module.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(module.name)
        except Exception as e:  # a DuplicateFlagError names both modules
            failed[module.name] = f"{type(e).__name__}: {e}"
    assert not failed, failed
