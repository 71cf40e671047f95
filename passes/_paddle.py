"""The one place that checks the installed Paddle: pipesplit uses internal executor and PIR APIs
that change between releases, so it runs only on the versions it is tested with."""
from __future__ import annotations

#: newest first (the one the install hint names)
SUPPORTED_PADDLE_VERSIONS = ("3.3.1", "3.3.0")
_INSTALL = f"pip install paddlepaddle=={SUPPORTED_PADDLE_VERSIONS[0]}"


def require_supported_paddle():
    try:
        import paddle
    except ImportError as error:  # pragma: no cover - exercised only without paddle
        raise ImportError(
            "pipesplit.passes needs PaddlePaddle "
            f"{' or '.join(SUPPORTED_PADDLE_VERSIONS)}: {_INSTALL}") from error
    version = paddle.__version__
    if version not in SUPPORTED_PADDLE_VERSIONS:
        raise ImportError(
            f"pipesplit supports PaddlePaddle {' or '.join(SUPPORTED_PADDLE_VERSIONS)} (it uses "
            f"internal executor and PIR APIs that change between releases); found {version}. "
            f"Install a supported version: {_INSTALL}")
    return paddle
