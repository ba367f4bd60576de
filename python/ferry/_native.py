"""The compiled layer, imported so that `import ferry` never fails because of it."""

from __future__ import annotations

try:
    from . import _ferry as native

    IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    native = None
    IMPORT_ERROR = exc


def hooks():
    """What the tests and benchmarks reach into (ferry._hooks: a kernel that
    fires a device trigger, one that holds every SM, single kernel launches),
    a module of its own outside the extension users load."""
    require()
    from . import _hooks

    return _hooks


def require():
    """The native module, or an ImportError that says how to get it."""
    if native is None:
        raise ImportError(
            f"ferry's compiled extension is not importable ({IMPORT_ERROR}); "
            "reinstall with `pip install .` from a ferry checkout"
        )
    return native
