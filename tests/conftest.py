import keras
import pytest


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


@pytest.fixture(autouse=True)
def _fixed_seed():
    keras.utils.set_random_seed(0)
