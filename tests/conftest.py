import keras
import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--large", action="store_true", default=False,
        help="also run the tests marked `large` (full-size models, one forward "
        "pass each); scripts/run_tests.sh and CI always pass it",
    )


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--large"):
        return
    skip = pytest.mark.skip(reason="full-size model: opt in with --large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fixed_seed():
    keras.utils.set_random_seed(0)
