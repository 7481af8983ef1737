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
