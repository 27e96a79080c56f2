import os

import pytest

# Rich sizes its consoles from COLUMNS when they are created (gdnbench.cli.app's, at import): wide enough
# that table cells are not wrapped, also in pytest-xdist workers, whose stdout is not a terminal.
os.environ["COLUMNS"] = "250"
# what gdnbench writes at run time (autotune entries, Helion configs) goes to a throwaway user cache, never
# the developer's ~/.cache/gdnbench
if "GDNBENCH_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["GDNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="gdnbench-test-cache-")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
