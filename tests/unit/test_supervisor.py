"""The supervisord files host/supervisor.py writes, read back by supervisord's own parser."""

from __future__ import annotations

import shlex
import stat
from pathlib import Path

import pytest
from supervisor.datatypes import RestartUnconditionally, process_or_group_name
from supervisor.options import ServerOptions

from host import supervisor
from host.files import write_private

# What a fleet's command and environment can hold: JSON with quotes and '%', URLs with
# URL-encoded passwords, commas and '=' in values.
COMMAND = ["/venv/bin/python", "-m", "consumers.runtime.fleet",
           "--run-id", "manual__2026-01-01T00:00:00+00:00",
           "--config", '{"note": "50% of it\'s", "time_scale": 0.05}', "--members", "4"]
ENVIRONMENT = {"DATABASE_URL": "postgresql://u:p%40ss@127.0.0.1:5433/pipeline",
               "AI_SERVICE_TOKEN": "tok,en=with;sep#s", "QUOTED": 'say "hi" now', "APOSTROPHE": "it's",
               "EMPTY": ""}


def parsed(paths: supervisor.Paths, *programs: supervisor.Program) -> ServerOptions:
    """The files as supervisord reads them at start-up."""
    paths.programs.mkdir(parents=True)
    paths.logs.mkdir()
    write_private(paths.conf, supervisor.render_supervisord(paths))
    for program in programs:
        write_private(paths.program_conf(program.name), program.render(paths))
    options = ServerOptions()
    options.realize(args=["-c", str(paths.conf)])
    return options


def fleet_program(name: str = "fleet-r1-check") -> supervisor.Program:
    return supervisor.Program(name, COMMAND, Path("/srv/repo"), ENVIRONMENT, stopwaitsecs=60)


def test_command_and_environment_reach_the_process_unchanged(tmp_path: Path) -> None:
    options = parsed(supervisor.Paths(tmp_path), fleet_program())
    (group,) = options.process_group_configs
    (process,) = group.process_configs
    assert shlex.split(process.command) == COMMAND
    assert process.environment == ENVIRONMENT
    assert process.directory == "/srv/repo"


def test_restart_and_stop_policy(tmp_path: Path) -> None:
    paths = supervisor.Paths(tmp_path)
    process = parsed(paths, fleet_program()).process_group_configs[0].process_configs[0]
    assert process.autorestart is RestartUnconditionally
    assert (process.startsecs, process.startretries, process.stopwaitsecs) == (5, 10, 60)
    assert process.stopsignal == 15
    assert process.stopasgroup and process.killasgroup
    assert process.redirect_stderr
    assert process.stdout_logfile == str(paths.program_log("fleet-r1-check"))


def test_daemon_listens_on_its_socket_and_includes_the_programs(tmp_path: Path) -> None:
    paths = supervisor.Paths(tmp_path)
    options = parsed(paths, fleet_program("a"), fleet_program("b"))
    (server,) = options.server_configs
    assert server["file"] == str(paths.socket)
    assert server["chmod"] == 0o700
    assert options.pidfile == str(paths.pidfile)
    assert options.logfile == str(paths.logfile)
    assert sorted(g.name for g in options.process_group_configs) == ["a", "b"]


def test_program_files_are_owner_only_even_when_rewritten(tmp_path: Path) -> None:
    target = tmp_path / "programs" / "p.conf"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["p.conf"]


@pytest.mark.parametrize("run_id", ["manual__2026-01-01T00:00:00+00:00", "a b/c", "x%y[z]", "r" * 300])
def test_names_from_any_run_id_are_valid_supervisord_names(run_id: str) -> None:
    name = supervisor.program_name("fleet", run_id, "check")
    assert process_or_group_name(name) == name
    assert len(name) <= 120
    assert supervisor.program_name(name) == name


def test_clean_names_stay_readable_and_unclean_ones_stay_apart() -> None:
    assert supervisor.program_name("fleet", "tuning-20260101t000000-v3", "generate") == \
        "fleet-tuning-20260101t000000-v3-generate"
    assert supervisor.program_name("a:b") != supervisor.program_name("a+b")
    assert supervisor.program_name("r" * 300 + "1") != supervisor.program_name("r" * 300 + "2")


def test_a_program_name_must_already_be_valid(tmp_path: Path) -> None:
    program = supervisor.Program("fleet:r1", ["true"], tmp_path, {}, stopwaitsecs=10)
    with pytest.raises(ValueError, match="program name"):
        program.render(supervisor.Paths(tmp_path))


@pytest.mark.parametrize("value, reason", [
    ("both ' and \" here", "both kinds of quote"),
    ('"leading', "strips quotes"),
    ("trailing'", "strips quotes"),
    ("two\nlines", "line break"),
    ("cut ;here", "' ;'"),
    ("cut #here", "' #'"),
])
def test_environment_values_supervisord_cannot_carry_are_refused(value: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        supervisor.render_environment({"KEY": value})


@pytest.mark.parametrize("key", ["1ST", "A-B", "A B", "A=B", ""])
def test_invalid_variable_names_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        supervisor.render_environment({key: "x"})


def test_supervisor_url_names_the_folder() -> None:
    paths = supervisor.Paths(Path("/srv/stack/supervisor"))
    assert paths.url == "unix:///srv/stack/supervisor/supervisord.sock"
    assert supervisor.Paths.from_url(paths.url) == paths
    with pytest.raises(ValueError, match="unix://"):
        supervisor.Paths.from_url("http://127.0.0.1:9001")
