"""The one gate for Paddle releases (``pipesplit.passes._paddle``): the supported releases by
line, the refusal of any other naming it, the pinned release the install commands name, and
every Paddle name the door patches present in the release installed here (``.ci/run`` runs this
module on each supported line)."""
from __future__ import annotations

import re
import warnings

import paddle
import pytest

from pipesplit.passes import _paddle
from pipesplit.passes._paddle import (PADDLEFORMERS_RELEASES, PINNED_PADDLE_VERSION,
                                      SUPPORTED_PADDLE_LINES, SUPPORTED_PADDLE_VERSIONS,
                                      UNTESTED_ENV, check_version, require_supported_paddle)
from pipesplit.passes.engine import paddle_patches

from _paths import REPO


def test_the_supported_releases_are_every_release_of_the_3_0_to_3_3_lines():
    assert SUPPORTED_PADDLE_LINES == {"3.3": ("3.3.1", "3.3.0"),
                                      "3.2": ("3.2.2", "3.2.1", "3.2.0"),
                                      "3.1": ("3.1.1", "3.1.0"),
                                      "3.0": ("3.0.0",)}
    assert SUPPORTED_PADDLE_VERSIONS == ("3.3.1", "3.3.0", "3.2.2", "3.2.1", "3.2.0", "3.1.1",
                                         "3.1.0", "3.0.0")
    for line, releases in SUPPORTED_PADDLE_LINES.items():
        assert all(r.rpartition(".")[0] == line for r in releases), line
    assert set(PADDLEFORMERS_RELEASES) == {"3.3.1", "3.3.0", "3.2.2", "3.2.1", "3.2.0"}
    assert set(_paddle.NEEDS_PROTOBUF_LABEL) == set(SUPPORTED_PADDLE_VERSIONS) - {"3.3.1"}


def test_the_pinned_release_is_the_one_the_install_commands_name():
    assert PINNED_PADDLE_VERSION == "3.3.1"
    assert f"paddlepaddle=={PINNED_PADDLE_VERSION}" in \
        (REPO / "requirements.txt").read_text().splitlines()
    assert set(re.findall(r"paddlepaddle==([\d.]+)", (REPO / "setup.py").read_text())) == \
        {PINNED_PADDLE_VERSION}


def test_ci_runs_every_line_on_its_newest_release():
    """``.ci/run``: the whole suite on the pinned release, the CI subset on the newest release
    of every other line (and on the pinned line's other release)."""
    text = (REPO / ".ci" / "run").read_text()
    others = re.search(r"^other_releases=\(([^)]*)\)", text, re.M).group(1).split()
    newest = {releases[0] for releases in SUPPORTED_PADDLE_LINES.values()}
    assert set(others) | {PINNED_PADDLE_VERSION} >= newest
    assert PINNED_PADDLE_VERSION not in others
    assert set(others) <= set(SUPPORTED_PADDLE_VERSIONS)


def test_this_release_is_supported_and_has_every_name_the_door_patches():
    assert paddle.__version__ in SUPPORTED_PADDLE_VERSIONS
    assert require_supported_paddle() is paddle
    for group in paddle_patches.GROUPS:
        paddle_patches.check_names(group)  # a PaddleMismatchError would name what is missing


@pytest.mark.parametrize("release", ["3.0.1", "2.6.2", "3.4.0", "3.3.2", "3.1.1rc0",
                                     "3.0.0rc1"])
def test_another_release_is_refused_naming_it_and_the_supported_ones(monkeypatch, release):
    monkeypatch.delenv(UNTESTED_ENV, raising=False)
    with pytest.raises(ImportError) as info:
        check_version(release)
    message = str(info.value)
    assert f"found {release}." in message
    assert "3.3.1, 3.3.0; 3.2.2, 3.2.1, 3.2.0; 3.1.1, 3.1.0; 3.0.0" in message
    assert message.endswith("pip install paddlepaddle==3.3.1")
    monkeypatch.setattr(paddle, "__version__", release)
    with pytest.raises(ImportError, match=re.escape(f"found {release}.")):
        require_supported_paddle()


def test_every_supported_release_passes_the_gate(monkeypatch):
    monkeypatch.delenv(UNTESTED_ENV, raising=False)
    for release in SUPPORTED_PADDLE_VERSIONS:
        check_version(release)


def test_the_untested_switch_lets_exactly_its_release_through_with_a_warning(monkeypatch):
    monkeypatch.setenv(UNTESTED_ENV, "3.4.0")
    with pytest.warns(UserWarning, match=r"pipesplit is not tested with PaddlePaddle 3\.4\.0 "
                                         r"\(PIPESPLIT_UNTESTED_PADDLE lets it through\)"):
        check_version("3.4.0")
    with pytest.raises(ImportError, match=r"found 3\.4\.1\."):
        check_version("3.4.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_version(PINNED_PADDLE_VERSION)  # a supported release: no warning


def test_the_door_names_the_release_that_lacks_a_name(monkeypatch):
    from pipesplit.passes.engine.door import Patch, PatchDoor, PaddleMismatchError

    door = PatchDoor([Patch("paddle.distributed.auto_parallel.static.engine.Engine",
                            "no_such_method_anywhere", lambda f: f, "engine")])
    with pytest.raises(PaddleMismatchError) as info:
        door.enable("engine")
    assert (f"pipesplit needs paddle.distributed.auto_parallel.static.engine.Engine."
            f"no_such_method_anywhere, which this Paddle ({paddle.__version__}) does not have; "
            f"supported: 3.3.1, 3.3.0") in str(info.value)


_COMPARED = re.compile(r"__version__\s*(==|!=|<|>|\bin\b|\.startswith|\.split|\[)"
                       r"|(==|!=|<|>|\bin)\s*paddle\.__version__|parse_version|LooseVersion")


def test_no_other_module_compares_paddle_s_version():
    """The gate is the one place: no other module of the library decides anything by Paddle's
    version (it may record or print it)."""
    compared = []
    for package in ("passes", "ir_utils", "job_list", "tools"):
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "passes" / "_paddle.py":
                continue
            compared += [f"{path.relative_to(REPO)}: {line.strip()}"
                         for line in path.read_text().splitlines()
                         if "version" in line and _COMPARED.search(line)]
    assert compared == []
    assert _paddle.__doc__.startswith("The one place that checks the installed Paddle")


def test_paddleformers_is_left_out_where_its_own_code_cannot_run():
    from pipesplit.passes._paddle import paddleformers_cannot_run

    for release in ("3.1.1", "3.1.0", "3.0.0"):
        assert "paddle.distributed.auto_parallel._utils" in paddleformers_cannot_run(release)
    for release in ("3.2.0", "3.2.2", "3.3.0", "3.3.1"):
        assert paddleformers_cannot_run(release) is None, release


def test_a_release_that_reads_protobuf_s_label_is_refused_beside_protobuf_7(monkeypatch):
    import google.protobuf

    monkeypatch.setattr(_paddle, "_protobuf_has_label", lambda: False)
    for release in _paddle.NEEDS_PROTOBUF_LABEL:
        with pytest.raises(ImportError) as info:
            _paddle.check_protobuf(release)
        assert str(info.value) == (
            f"PaddlePaddle {release} reads protobuf's FieldDescriptor.label, which protobuf "
            f"{google.protobuf.__version__} no longer has (Paddle's fleet.DistributedStrategy "
            "then fails: 'hybrid_configs is not a attribute of DistributedStrategy'); install "
            "protobuf 6 beside it: pip install protobuf==6.33.6")
    _paddle.check_protobuf("3.3.1")  # reads either
    _paddle.check_protobuf("3.4.0")  # (an untested release: not known to need it)
    monkeypatch.setattr(paddle, "__version__", "3.2.2")
    with pytest.raises(ImportError, match=r"PaddlePaddle 3\.2\.2 reads protobuf's"):
        require_supported_paddle()
    monkeypatch.setattr(_paddle, "_protobuf_has_label", lambda: True)
    assert require_supported_paddle() is paddle


def test_this_release_has_the_protobuf_it_needs():
    """(What the gate checks at import, read directly: the environment made for this release
    has the piece, and fleet's strategy builds its hybrid config dict.)"""
    from paddle.distributed import fleet

    if paddle.__version__ in _paddle.NEEDS_PROTOBUF_LABEL:
        assert _paddle._protobuf_has_label()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 1, "pp_degree": 2}
    assert strategy.hybrid_configs["pp_degree"] == 2


def test_what_paddle_itself_cannot_do_is_named_per_line():
    from pipesplit.passes._paddle import ONE_D_STAGE_MESHES, PADDLE_CANNOT, paddle_cannot

    assert set(PADDLE_CANNOT) <= set(SUPPORTED_PADDLE_LINES)
    assert "get_mesh_with_dim" in paddle_cannot("3.0.0", ONE_D_STAGE_MESHES)
    for release in ("3.1.0", "3.1.1", "3.2.2", "3.3.0", "3.3.1"):
        assert paddle_cannot(release, ONE_D_STAGE_MESHES) is None, release
