"""The `kbrouter` console script: every subcommand has --help, bad input gives one clear message."""

import json

import pytest

from kbrouter.cli import COMMANDS, main


def test_top_level_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_unknown_command_lists_valid_ones(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["ask", ""], "empty question"),  # an empty question
        (["run", "--kb", "configs/kb/demo.yaml", "--questions", "/nonexistent.jsonl", "--out", "x"], "does not exist"),
        (["ask", "q", "--kb", "/nonexistent.yaml"], "nonexistent.yaml"),  # a missing KB file is named
    ],
)
def test_bad_input_is_one_clear_message(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_broken_question_line_is_named(tmp_path, capsys):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "a", "question": "fine"}) + "\n{oops\n")
    assert main(["run", "--kb", "configs/kb/demo.yaml", "--questions", str(q), "--out", str(tmp_path / "o")]) == 2
    assert "q.jsonl:2" in capsys.readouterr().err


def test_unknown_key_in_agent_config_is_named(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent:\n  max_stepz: 2\n")
    assert main(["ask", "q", "--config", str(cfg)]) == 2
    assert "max_stepz" in capsys.readouterr().err


def test_a_yaml_syntax_error_is_one_line_naming_file_and_line(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent:\n  max_steps: [2\n")
    assert main(["ask", "q", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}:3:1: YAML syntax error" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_non_utf8_question_file_names_the_file_and_line(tmp_path, capsys):
    q = tmp_path / "q.jsonl"
    q.write_bytes(json.dumps({"id": "a", "question": "fine"}).encode() + b'\n{"id": "b", "question": "caf\xe9"}\n')
    assert main(["run", "--kb", "configs/kb/demo.yaml", "--questions", str(q), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{q}:2: not UTF-8 text" in err and "save the file as UTF-8" in err and "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent:\n  max_stepz: 2\n")
    with pytest.raises(ValueError, match="max_stepz"):
        main(["--debug", "ask", "q", "--config", str(cfg)])
    with pytest.raises(ValueError, match="max_stepz"):
        main(["ask", "q", "--config", str(cfg), "--debug"])


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import retrievers.build

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(retrievers.build, "main", interrupted)
    assert main(["index", "--kb", "x.yaml"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == "kbrouter index: interrupted: what was already written is kept; rerun the same command to resume"


def test_an_unexpected_error_keeps_its_traceback(monkeypatch):
    import retrievers.build

    def bug(argv):
        raise TypeError("a bug")

    monkeypatch.setattr(retrievers.build, "main", bug)
    with pytest.raises(TypeError, match="a bug"):
        main(["index", "--kb", "x.yaml"])


def test_ctrl_c_keeps_a_commands_own_resume_hint(monkeypatch, capsys):
    import training.cli

    def interrupted(argv):
        raise KeyboardInterrupt("stopped at step 7; rerun with --resume_from_checkpoint true")

    monkeypatch.setattr(training.cli, "main", interrupted)
    assert main(["train", "sft", "--config", "x.yaml"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == "kbrouter train: interrupted: stopped at step 7; rerun with --resume_from_checkpoint true"
