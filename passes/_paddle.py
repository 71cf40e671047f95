"""The one place that checks the installed Paddle: pipesplit uses internal executor and PIR APIs
that change between releases, so it runs only on the releases it is tested with.

The releases are listed per line, newest first.  Each line's newest release runs the whole
suite (its figures in README, "Supported Paddle releases"); ``.ci/run`` runs the whole suite on
the pinned release (``requirements.txt``) and, on the newest release of each other line and on
3.3.0, the tests of the Paddle internals pipesplit relies on plus engine launches
(``tools/check_paddle_release.py --ci-subset``).  Every Paddle name pipesplit patches is also
checked where it is patched (:mod:`pipesplit.passes.engine.door`): a release that lacks one is
told which.  A release that needs a piece of another package it cannot find (protobuf's
``FieldDescriptor.label``) is refused naming both.  No other module compares Paddle's version.
"""
from __future__ import annotations

import os
import warnings

#: line -> its supported releases, newest first
SUPPORTED_PADDLE_LINES = {
    "3.3": ("3.3.1", "3.3.0"),
    "3.2": ("3.2.2", "3.2.1", "3.2.0"),
    "3.1": ("3.1.1", "3.1.0"),
    "3.0": ("3.0.0",),
}
#: every supported release, newest first (the first is the pinned one the install hint names)
SUPPORTED_PADDLE_VERSIONS = tuple(v for line in SUPPORTED_PADDLE_LINES.values() for v in line)
PINNED_PADDLE_VERSION = SUPPORTED_PADDLE_VERSIONS[0]
#: protobuf for every release but the pinned one: they read protobuf's
#: ``FieldDescriptor.label`` (fleet's ``DistributedStrategy`` builds each of its config dicts
#: with it: ``hybrid_configs``, ``pipeline_configs`` ...), which protobuf 7 removed; under
#: protobuf 7 ``fleet.init`` with a hybrid strategy fails (``hybrid_configs is not a attribute
#: of DistributedStrategy``).  3.3.1 reads either.  The gate refuses such a release beside
#: protobuf 7, and ``tools/check_paddle_release.py`` installs this pin with it.
PROTOBUF_PIN = "protobuf==6.33.6"
NEEDS_PROTOBUF_LABEL = tuple(v for v in SUPPORTED_PADDLE_VERSIONS if v != "3.3.1")
#: lines on which PaddleFormers 0.4.0's ``AutoTrainer`` (the model library's trainer) cannot
#: run, and why: in its own code, before pipesplit runs (not a limit of pipesplit's); its tests
#: run on the other lines, and ``tools/check_paddle_release.py`` installs it only there
_NO_AUTO_TRAINER = ("its AutoTrainer does not import (No module named "
                    "'paddle.distributed.auto_parallel._utils')")
PADDLEFORMERS_CANNOT_RUN = {
    "3.1": _NO_AUTO_TRAINER,
    "3.0": _NO_AUTO_TRAINER,
}
PADDLEFORMERS_RELEASES = tuple(v for line, releases in SUPPORTED_PADDLE_LINES.items()
                               if line not in PADDLEFORMERS_CANNOT_RUN for v in releases)
#: what Paddle's own code cannot do on a line (before pipesplit runs, not a limit of
#: pipesplit's), by name: the tests that need it are skipped there with the release and why
ONE_D_STAGE_MESHES = "stage meshes cut from a 1-D global mesh"
PADDLE_CANNOT = {
    "3.0": {
        ONE_D_STAGE_MESHES:
            "ProcessMesh.get_mesh_with_dim cuts no stage mesh from a 1-D mesh (ValueError: "
            "The mesh must be an instance of list or np.ndarray)",
    },
}
#: ``PIPESPLIT_UNTESTED_PADDLE=X.Y.Z`` lets exactly that (unlisted) release through, with a
#: warning: how ``tools/check_paddle_release.py --untested`` tries a new release
UNTESTED_ENV = "PIPESPLIT_UNTESTED_PADDLE"
_INSTALL = f"pip install paddlepaddle=={PINNED_PADDLE_VERSION}"


def supported_text() -> str:
    """The supported releases by line: ``3.3.1, 3.3.0; 3.2.2, 3.2.1, 3.2.0; 3.1.1, 3.1.0;
    3.0.0``."""
    return "; ".join(", ".join(line) for line in SUPPORTED_PADDLE_LINES.values())


def check_version(version: str) -> None:
    """An ``ImportError`` naming ``version`` unless pipesplit supports it (or it is the release
    :data:`UNTESTED_ENV` names: a ``UserWarning`` then)."""
    if version in SUPPORTED_PADDLE_VERSIONS:
        return
    if os.environ.get(UNTESTED_ENV) == version:
        warnings.warn(f"pipesplit is not tested with PaddlePaddle {version} ({UNTESTED_ENV} "
                      f"lets it through); supported: {supported_text()}", UserWarning,
                      stacklevel=3)
        return
    raise ImportError(
        f"pipesplit supports PaddlePaddle {supported_text()} (it uses internal executor and "
        f"PIR APIs that change between releases); found {version}. Install a supported "
        f"release: {_INSTALL}")


def _protobuf_has_label() -> bool:
    from google.protobuf import descriptor

    return hasattr(descriptor.FieldDescriptor, "label")


def check_protobuf(version: str) -> None:
    """An ``ImportError`` naming ``version`` and protobuf's missing ``FieldDescriptor.label``
    where the release reads it and the installed protobuf (7) lacks it."""
    if version not in NEEDS_PROTOBUF_LABEL or _protobuf_has_label():
        return
    import google.protobuf

    raise ImportError(
        f"PaddlePaddle {version} reads protobuf's FieldDescriptor.label, which protobuf "
        f"{google.protobuf.__version__} no longer has (Paddle's fleet.DistributedStrategy "
        f"then fails: 'hybrid_configs is not a attribute of DistributedStrategy'); install "
        f"protobuf 6 beside it: pip install {PROTOBUF_PIN}")


def paddle_cannot(version: str, feature: str):
    """Why Paddle ``version`` itself cannot do ``feature`` (a name of :data:`PADDLE_CANNOT`;
    None: it can)."""
    return PADDLE_CANNOT.get(version.rpartition(".")[0], {}).get(feature)


def paddleformers_cannot_run(version: str):
    """Why PaddleFormers 0.4.0's trainer cannot run on Paddle ``version`` (None: it runs)."""
    return PADDLEFORMERS_CANNOT_RUN.get(version.rpartition(".")[0])


def require_supported_paddle():
    try:
        import paddle
    except ImportError as error:  # pragma: no cover - exercised only without paddle
        raise ImportError(
            f"pipesplit.passes needs PaddlePaddle ({supported_text()}): {_INSTALL}") from error
    check_version(paddle.__version__)
    check_protobuf(paddle.__version__)
    return paddle
