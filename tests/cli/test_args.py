"""``attnhal.cli.args``: the public parameter types, their messages, and how the CLI names the flag."""

import argparse

import pytest

from attnhal.cli.app import _Parser
from attnhal.cli.args import BadArgument, Bounded, bounded, choice, int_list, seconds, within


def rejected(convert, text):
    with pytest.raises(argparse.ArgumentTypeError) as info:
        convert(text)
    return str(info.value)


def test_bounded_takes_both_ends_and_nothing_beyond():
    b = bounded(1, 16)
    assert isinstance(b, Bounded) and (b.low, b.high) == (1, 16)
    assert [b("1"), b("16"), b(" 7 "), b("+3")] == [1, 16, 7, 3]
    assert rejected(b, "0") == "0 (supported: an integer 1..16)"
    assert rejected(b, "17") == "17 (supported: an integer 1..16)"
    assert rejected(b, "-1") == "-1 (supported: an integer 1..16)"
    assert bounded(0, 0)("0") == 0 and rejected(bounded(0, 0), "1") == "1 (supported: an integer 0..0)"


def test_bounded_quotes_text_that_is_no_integer_and_cuts_long_values():
    b = bounded(0, 16)
    for text in ("1.5", "x", "", "1e3", "0x10", "--5"):
        assert rejected(b, text) == f"{text!r} (supported: an integer 0..16)"
    assert rejected(b, "1" * 25) == "11111111111111111111... (supported: an integer 0..16)"
    # too long for int() (over 4300 digits) is text, not a number
    assert rejected(b, "9" * 5000) == "'99999999999999999999...' (supported: an integer 0..16)"


def test_bounded_shows_its_range_and_refuses_an_empty_one():
    assert str(bounded(0, 2**31 - 1)) == "0..2147483647"
    with pytest.raises(ValueError, match=r"bounded\(low=5, high=1\) \(supported: low <= high\)"):
        bounded(5, 1)
    assert bounded(1, 4) == bounded(1, 4) and hash(bounded(1, 4)) == hash(bounded(1, 4))


def test_help_writes_the_bound_once_with_the_type_placeholder():
    p = _Parser(prog="attnhal x")
    p.add_argument("--jobs", type=bounded(1, 64), default=2, help="parallel compiles, %(type)s")
    assert "parallel compiles, 1..64 (default: 2)" in " ".join(p.format_help().split())


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "99"], "--jobs=99 (supported: an integer 1..64)"),
    (["--jobs=-3"], "--jobs=-3 (supported: an integer 1..64)"),
    (["--jobs", "many"], "--jobs='many' (supported: an integer 1..64)"),
    (["--sizes", "8", "0"], "--sizes=0 (supported: an integer 1..9)"),
    (["--jobs"], "argument --jobs: expected one argument"),
])
def test_the_cli_parser_names_the_flag_once(argv, message, capsys):
    p = _Parser(prog="attnhal x")
    p.add_argument("--jobs", type=bounded(1, 64), help="h")
    p.add_argument("--sizes", nargs="+", type=bounded(1, 9), help="h")
    with pytest.raises(SystemExit) as info:
        p.parse_args(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"attnhal x: error: {message} (see 'attnhal x --help')\n"


def test_a_plain_argparse_parser_still_reads_well():
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--jobs", type=bounded(1, 64))
    with pytest.raises(argparse.ArgumentError) as info:
        p.parse_args(["--jobs", "0"])
    assert str(info.value) == "argument --jobs: 0 (supported: an integer 1..64)"


def test_choice_int_list_seconds():
    model = choice(("mha", "gqa", "mla"))
    assert model("gqa") == "gqa"
    assert rejected(model, "moe") == "'moe' (supported: mha, gqa, mla)"
    assert int_list("1,3,5") == (1, 3, 5)
    assert rejected(int_list, "1,x") == "'1,x' (supported: integers 0..2147483648 separated by commas)"
    assert seconds("0.5") == 0.5
    for text in ("0", "-1", "nan", "soon", "inf", "1e308"):
        assert rejected(seconds, text) == f"{text!r} (supported: a finite number 0.001..86400 seconds)"


def test_a_refusal_carries_its_value_and_what_is_allowed_as_data():
    with pytest.raises(BadArgument) as info:
        bounded(1, 16)("99")
    assert (info.value.value, info.value.supported) == (99, "an integer 1..16")
    assert info.value.naming("--topk") == "--topk=99 (supported: an integer 1..16)"
    with pytest.raises(BadArgument) as info:
        choice(("mha", "gqa"))("moe")
    assert (info.value.value, info.value.naming("--model")) == ("moe", "--model='moe' (supported: mha, gqa)")


def test_within_takes_the_records_bound_and_an_off_value_just_below_it():
    from attnhal.spec import NUM_STEPS

    steps = within(NUM_STEPS, off=0)
    assert (steps.low, steps.high, steps.bound) == (0, 64, NUM_STEPS) and steps("0") == 0
    with pytest.raises(ValueError, match=r"off=-5 \(supported: 0, just below num_steps's 1..64\)"):
        within(NUM_STEPS, off=-5)


def test_a_positional_argument_is_named_by_its_metavar(capsys):
    p = _Parser(prog="attnhal x")
    p.add_argument("count", metavar="N", type=bounded(1, 3))
    with pytest.raises(SystemExit):
        p.parse_args(["7"])
    assert capsys.readouterr().err == "attnhal x: error: N=7 (supported: an integer 1..3) (see 'attnhal x --help')\n"
