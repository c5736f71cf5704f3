"""tests/net/: the network runtime's tests, one file per concern, and what they share.

The helpers several files use (the tiny scenario of the network runs, the seeded-parity check
against the simulator, hosts driven in this process, credentials) live in
``tests/net/helpers.py``; their ``assert`` statements are rewritten as in a test module, so a
failing comparison shows both values.
"""

import pytest

pytest.register_assert_rewrite("tests.net.helpers")
