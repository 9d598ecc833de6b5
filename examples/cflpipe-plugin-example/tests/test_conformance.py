"""The plugin's method passes cflpipe's conformance checks (resume, determinism, traffic, state,
trainers …), run from the plugin's own tests: `python3 -m pytest examples/cflpipe-plugin-example/tests`."""

from cflpipe.testing import parametrize_with_checks


@parametrize_with_checks(["fedavgm"])
def test_conformance(method, check, tmp_path):
    check(method, tmp_path)
