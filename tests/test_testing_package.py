"""``bot.testing`` is test support: the service itself never imports it.

The platforms' fakes and the vLLM server launcher ship with the package so that the tests
and the benchmarks import them from one place; a production process must not depend on
them, nor they on the service (a fake that borrowed the service's code would agree with
it by construction).
"""

from __future__ import annotations

from tests.test_layers import package_imports


def test_no_module_of_the_service_imports_the_test_support() -> None:
    imports = package_imports()
    importers = {package for package, imported in imports.items() if "testing" in imported}
    assert importers - {"testing"} == set(), {
        package: sorted(imports[package]["testing"]) for package in importers
    }


def test_the_test_support_imports_nothing_of_the_service() -> None:
    assert dict(package_imports().get("testing", {})) == {}
