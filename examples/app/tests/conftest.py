import pytest
from flask.testing import FlaskClient

from fetchapp.web import build_app

pytest_plugins = ["sift.testing"]  # sift_store, sift_clock, make_job, make_targets


@pytest.fixture
def client(sift_store: object) -> FlaskClient:
    """The app on the test's fresh store, through Flask's test client."""
    return build_app().test_client()
