"""Point pytest-msched at the toy engine: its multi-stream pass and its stream ops.

The ini form of the same two lines is ``ini-form/pytest.ini``.
"""

import pytest
import toyengine

import msched


@pytest.fixture(scope="session")
def msched_scheduler():
    return toyengine.multistream.schedule


@pytest.fixture(scope="session")
def msched_dialect():
    return msched.Dialect.from_namespace("toyeng")
