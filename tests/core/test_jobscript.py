"""coorm.batch.jobscript: job scripts and options read as Slurm's sbatch reads them."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coorm.batch.jobscript import (
    NO_VAL,
    ArraySpec,
    Dependency,
    DependencySpec,
    ExportSpec,
    JobOptions,
    ScriptError,
    expand_filename,
    export_environment,
    parse_array,
    parse_dependency,
    parse_export,
    parse_options,
    parse_script,
)


def script(*lines: str) -> str:
    return "\n".join(["#!/bin/bash", *lines, ""])


def refused(fn: Callable[..., object], *args: object, **kwargs: object) -> str:
    """The message of the ScriptError ``fn`` raises; every refusal must be one line."""
    with pytest.raises(ScriptError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# --------------------------------------------------------------------------------------------------------------
# parse_script: where directives are


@pytest.mark.parametrize("directive", ["-N 4", "-N4", "--nodes 4", "--nodes=4"])
def test_every_option_form_reads_the_same(directive):
    options, warnings = parse_script(script(f"#SBATCH {directive}", "srun hostname"))
    assert options == JobOptions(nodes=4)
    assert warnings == []


def test_every_option_is_read_into_its_field():
    text = script(
        "#SBATCH -N 2 -t 1:30:00 -J sweep",
        "#SBATCH -o out-%j.txt -e err-%j.txt",
        "#SBATCH -a 0-9%2 -d afterok:12",
        "#SBATCH -D /scratch/run --export=NONE,OMP_NUM_THREADS=4",
        "#SBATCH -p big -H",
        "./run",
    )
    options, warnings = parse_script(text)
    assert options == JobOptions(
        nodes=2, time="1:30:00", name="sweep", output="out-%j.txt", error="err-%j.txt", array="0-9%2",
        dependency="afterok:12", chdir="/scratch/run", export="NONE,OMP_NUM_THREADS=4", cluster="big", hold=True,
    )
    assert warnings == []


def test_long_forms_of_every_option():
    text = script(
        "#COORM --nodes=3 --time=10 --job-name=a --output=o --error=e --array=1,2 --dependency=singleton",
        "#COORM --chdir=/tmp --export=ALL --cluster=c1 --hold",
    )
    options, _ = parse_script(text)
    assert options == JobOptions(nodes=3, time="10", name="a", output="o", error="e", array="1,2",
                                 dependency="singleton", chdir="/tmp", export="ALL", cluster="c1", hold=True)


def test_blank_lines_and_comments_do_not_end_the_directives():
    text = script("", "# set up", "#SBATCH -N 2", "   ", "\t# more", "#SBATCH -J later", "hostname")
    options, _ = parse_script(text)
    assert (options.nodes, options.name) == (2, "later")


def test_directives_after_the_first_command_are_ignored():
    text = script("#SBATCH -N 2", "module load mpi", "#SBATCH -N 8", "#COORM -J late", "srun ./a.out")
    options, warnings = parse_script(text)
    assert options == JobOptions(nodes=2)
    assert warnings == [
        "line 4: #SBATCH after the first command (line 3) is ignored",
        "line 5: #COORM after the first command (line 3) is ignored",
    ]


def test_an_indented_command_also_ends_the_directives():
    options, _ = parse_script(script("  echo hi", "#SBATCH -N 5"))
    assert options.nodes is None


def test_an_indented_directive_is_a_comment_as_for_sbatch():
    options, warnings = parse_script(script("  #SBATCH -N 5", "#SBATCH -J x"))
    assert options == JobOptions(name="x")
    assert warnings == ["line 2: indented #SBATCH is not a directive (it must start the line)"]


def test_a_lowercase_or_other_prefix_is_not_a_directive():
    options, warnings = parse_script(script("#sbatch -N 5", "#PBS -l nodes=2", "# SBATCH -N 3", "true"))
    assert options == JobOptions()
    assert warnings == []


def test_the_old_slurm_prefix_is_read_as_sbatch_with_one_warning():
    options, warnings = parse_script(script("#SLURM -N 3", "#SLURM -J old", "#COORM -N 4"))
    assert options == JobOptions(nodes=4, name="old")
    assert warnings == ["line 2: #SLURM is read as #SBATCH, as sbatch does; write #SBATCH"]


def test_several_options_per_line_with_quotes_and_a_trailing_comment():
    text = script("#SBATCH -J 'my job' --output \"a b.out\" -N 3  # three nodes, -N 9 would be ignored")
    options, _ = parse_script(text)
    assert options == JobOptions(name="my job", output="a b.out", nodes=3)


def test_a_quoted_hash_is_kept_and_an_unquoted_one_starts_a_comment():
    options, _ = parse_script(script("#SBATCH -J 'run#1'", "#SBATCH -o out#2.txt -N 2"))
    assert options.name == "run#1"
    assert options.output == "out"  # sbatch too: an un-escaped '#' ends the arguments
    assert options.nodes is None


def test_the_later_line_wins_within_one_kind():
    options, _ = parse_script(script("#SBATCH -N 2 -J a", "#SBATCH -N 3"))
    assert (options.nodes, options.name) == (3, "a")


@pytest.mark.parametrize("coorm_first", [True, False])
def test_coorm_beats_sbatch_whatever_the_order(coorm_first):
    lines = ["#COORM -N 8 -c big", "#SBATCH -N 2 -p small -J from-sbatch"]
    options, _ = parse_script(script(*(lines if coorm_first else lines[::-1])))
    assert options == JobOptions(nodes=8, cluster="big", name="from-sbatch")


def test_sbatch_partition_names_the_cluster():
    options, _ = parse_script(script("#SBATCH --partition=gpu"))
    assert options.cluster == "gpu"


def test_sbatch_minus_c_is_cpus_per_task_and_is_ignored_with_a_warning():
    options, warnings = parse_script(script("#SBATCH -c 8 -N 1", "#SBATCH --cpus-per-task=4"))
    assert options == JobOptions(nodes=1)
    assert len(warnings) == 2
    assert warnings[0].startswith("line 2: #SBATCH -c (--cpus-per-task) ignored")
    assert warnings[1].startswith("line 3: #SBATCH --cpus-per-task (--cpus-per-task) ignored")


def test_unknown_sbatch_options_are_skipped_with_their_values_and_warned():
    text = script(
        "#SBATCH --mem=4G --ntasks 16 -N 2",
        "#SBATCH --mail-user=a@b.c --mail-type END -n4 -J x",
        "#SBATCH --exclusive -t 5 --requeue",
    )
    options, warnings = parse_script(text)
    assert options == JobOptions(nodes=2, name="x", time="5")
    assert warnings == [
        "line 2: #SBATCH --mem ignored: not an option CooRM supports",
        "line 2: #SBATCH --ntasks ignored: not an option CooRM supports",
        "line 3: #SBATCH --mail-user ignored: not an option CooRM supports",
        "line 3: #SBATCH --mail-type ignored: not an option CooRM supports",
        "line 3: #SBATCH -n ignored: not an option CooRM supports",
        "line 4: #SBATCH --exclusive ignored: not an option CooRM supports",
        "line 4: #SBATCH --requeue ignored: not an option CooRM supports",
    ]


def test_unknown_coorm_options_are_refused_with_their_line():
    assert refused(parse_script, script("#SBATCH -N 1", "#COORM --mem=4G")) == "line 3: #COORM unknown option --mem"
    assert refused(parse_script, script("#COORM -n 4")) == "line 2: #COORM unknown option -n"


def test_hold_is_a_flag():
    assert parse_script(script("#SBATCH --hold"))[0].hold is True
    assert parse_script(script("#SBATCH -H -N 1"))[0] == JobOptions(hold=True, nodes=1)
    assert "takes no value" in refused(parse_script, script("#SBATCH --hold=yes"))


# --------------------------------------------------------------------------------------------------------------
# parse_script: refusals


@pytest.mark.parametrize("text", ["", "\n#!/bin/bash\n", " #!/bin/sh\n", "#SBATCH -N 1\nhostname\n", "echo hi\n"])
def test_a_script_must_start_with_a_shebang(text):
    assert refused(parse_script, text).startswith("line 1: a job script must start with '#!'")


def test_dos_line_breaks_and_nul_characters_are_refused_as_sbatch_does():
    assert refused(parse_script, "#!/bin/bash\n#SBATCH -N 1\r\nhostname\r\n").startswith("line 2: DOS line break")
    assert refused(parse_script, "#!/bin/bash\necho\n\0\n") == "line 3: NUL character in the script"


@pytest.mark.parametrize(
    ("directive", "expected"),
    [
        ("#SBATCH -N 2-4", "line 2: #SBATCH -N: node count ranges not supported ('2-4'): give one number"),
        ("#SBATCH --nodes=2-4", "line 2: #SBATCH --nodes: node count ranges not supported ('2-4'): give one number"),
        ("#SBATCH -N 0", "line 2: #SBATCH -N: invalid node count '0': a positive integer is needed"),
        ("#SBATCH -N four", "line 2: #SBATCH -N: invalid node count 'four': a positive integer is needed"),
        ("#SBATCH -N", "line 2: #SBATCH -N needs a value"),
        ("#SBATCH --job-name=", "line 2: #SBATCH --job-name needs a value"),
        ("#SBATCH -J 'unbalanced", "line 2: #SBATCH cannot be split: No closing quotation"),
        ("#SBATCH -N 2 nodes", "line 2: #SBATCH unexpected argument 'nodes' (not an option)"),
        ("#SBATCHX", "line 2: #SBATCH unexpected argument 'X' (not an option)"),
        ("#SBATCH hetjob", "line 2: #SBATCH heterogeneous jobs ('hetjob') are not supported"),
    ],
)
def test_bad_directives_are_refused_naming_line_and_option(directive, expected):
    assert refused(parse_script, script(directive)) == expected


@pytest.mark.parametrize(
    ("directive", "option"),
    [("#SBATCH --array=5-1", "--array"), ("#SBATCH -a 1-9%0", "-a"), ("#SBATCH -d afterwards:1", "-d"),
     ("#SBATCH --dependency=afterok:1,afterany:2?afterok:3", "--dependency"), ("#COORM --export=1BAD", "--export")],
)
def test_values_are_checked_when_read(directive, option):
    message = refused(parse_script, script("#SBATCH -N 1", directive))
    assert message.startswith(f"line 3: {directive.split()[0]} {option}: ")


# --------------------------------------------------------------------------------------------------------------
# parse_options


def test_command_line_options_in_the_coorm_dialect():
    options, warnings = parse_options(["-c", "big", "-N8", "--time", "2:00", "-HJ", "run"], dialect="coorm")
    assert options == JobOptions(cluster="big", nodes=8, time="2:00", hold=True, name="run")
    assert warnings == []


def test_a_value_may_start_with_a_dash_as_with_getopt():
    assert parse_options(["-J", "-weird", "--output", "-"], dialect="coorm")[0] == JobOptions(name="-weird", output="-")


def test_the_coorm_dialect_refuses_what_it_does_not_know_and_the_sbatch_dialect_warns():
    assert refused(parse_options, ["--mem=4G"], dialect="coorm") == "unknown option --mem"
    options, warnings = parse_options(["--mem", "4G", "-N", "1"], dialect="sbatch")
    assert options == JobOptions(nodes=1)
    assert warnings == ["--mem ignored: not an option CooRM supports"]


def test_cluster_is_coorm_only():
    options, warnings = parse_options(["--cluster=a"], dialect="sbatch")
    assert options.cluster is None and len(warnings) == 1
    assert parse_options(["--cluster=a"], dialect="coorm")[0].cluster == "a"
    assert parse_options(["-p", "b"], dialect="coorm")[0].cluster == "b"


def test_a_stray_word_is_refused_in_both_dialects():
    message = refused(parse_options, ["-N", "1", "job.sh"], dialect="coorm")
    assert message == "unexpected argument 'job.sh' (not an option)"
    assert refused(parse_options, ["--"], dialect="sbatch") == "unexpected argument '--' (not an option)"


_text = st.text(st.sampled_from("abcXYZ019._/-:"), min_size=1, max_size=8).filter(lambda s: not s.startswith("-"))
_option_values = st.fixed_dictionaries(
    {},
    optional={
        "nodes": st.integers(1, 10_000),
        "time": _text,
        "name": _text,
        "output": _text,
        "error": _text,
        "chdir": _text,
        "cluster": _text,
        "array": st.sampled_from(["0-9", "1,3,7", "1-9:2%3"]),
        "dependency": st.sampled_from(["afterok:1", "singleton", "after:1?afterany:2_3"]),
        "export": st.sampled_from(["ALL", "NONE", "A,B=1"]),
        "hold": st.just(True),
    },
)
_SPELLINGS = {
    "nodes": ("-N", "--nodes"), "time": ("-t", "--time"), "name": ("-J", "--job-name"), "output": ("-o", "--output"),
    "error": ("-e", "--error"), "chdir": ("-D", "--chdir"), "cluster": ("-p", "--partition"),
    "array": ("-a", "--array"), "dependency": ("-d", "--dependency"), "export": ("--export", "--export"),
    "hold": ("-H", "--hold"),
}


@given(_option_values, st.data())
def test_options_read_back_whatever_their_form(values, data):
    groups: list[list[str]] = []  # one option's words
    for field, value in values.items():
        short, long = _SPELLINGS[field]
        if field == "hold":
            groups.append([data.draw(st.sampled_from([short, long]))])
            continue
        forms = [[long, str(value)], [f"{long}={value}"]]
        if short != long:
            forms += [[short, str(value)], [f"{short}{value}"]]
        groups.append(data.draw(st.sampled_from(forms)))
    expected = JobOptions(**values)
    argv = [word for group in groups for word in group]
    assert parse_options(argv, dialect="sbatch") == (expected, [])
    assert parse_options(argv, dialect="coorm") == (expected, [])
    assert parse_script(script("#SBATCH " + shlex.join(argv))) == (expected, [])
    assert parse_script(script(*(f"#COORM {shlex.join(group)}" for group in groups))) == (expected, [])


# --------------------------------------------------------------------------------------------------------------
# merged


def test_merged_lets_the_override_win_where_it_gives_a_value():
    base = JobOptions(nodes=2, name="a", cluster="x", hold=True)
    override = JobOptions(nodes=5, time="10")
    assert base.merged(override) == JobOptions(nodes=5, name="a", cluster="x", hold=True, time="10")
    assert override.merged(base) == JobOptions(nodes=2, name="a", cluster="x", hold=True, time="10")
    assert base.merged(JobOptions()) == base


_maybe_text = st.none() | st.text(max_size=3)
_options = st.builds(
    JobOptions, nodes=st.none() | st.integers(1, 9), time=_maybe_text, name=_maybe_text, output=_maybe_text,
    error=_maybe_text, array=_maybe_text, dependency=_maybe_text, chdir=_maybe_text, export=_maybe_text,
    cluster=_maybe_text, hold=st.none() | st.booleans(),
)
_FIELDS = ("nodes", "time", "name", "output", "error", "array", "dependency", "chdir", "export", "cluster", "hold")


@given(_options, _options)
def test_merged_takes_each_field_from_the_override_unless_it_is_none(base, override):
    merged = base.merged(override)
    for f in _FIELDS:
        expected = getattr(override, f) if getattr(override, f) is not None else getattr(base, f)
        assert getattr(merged, f) == expected


# --------------------------------------------------------------------------------------------------------------
# parse_array


@pytest.mark.parametrize(
    ("text", "indices", "max_running"),
    [
        ("0-999", tuple(range(1000)), None),
        ("0-999%50", tuple(range(1000)), 50),
        ("1,3,7", (1, 3, 7), None),
        ("7,3,1,3", (1, 3, 7), None),
        ("1-9:2", (1, 3, 5, 7, 9), None),
        ("0-15:4%2", (0, 4, 8, 12), 2),
        ("1,4-6,10-20:5%3", (1, 4, 5, 6, 10, 15, 20), 3),
        ("5", (5,), None),
        ("5-5", (5,), None),
        ("0-10:20", (0,), None),
    ],
)
def test_array_forms(text, indices, max_running):
    assert parse_array(text) == ArraySpec(indices=indices, max_running=max_running)


@pytest.mark.parametrize(
    "text",
    ["", "%4", "1-", "-1", "-3-5", "1--3", "3-1", "1-9:0", "1-9:-1", "1-9:", "1:2", "1,,2", "1,", ",1", "1-3%0",
     "1-3%", "1-3%x", "1-3%2%3", "1 - 3", " 1", "a", "1.5", "1-3:2:2", "٣"],
)
def test_malformed_arrays_are_refused(text):
    refused(parse_array, text)


def test_the_task_limit_counts_distinct_tasks():
    assert len(parse_array("0-99,0-99", max_tasks=100).indices) == 100
    assert "more than 100 tasks" in refused(parse_array, "0-100", max_tasks=100)
    assert "more than 100 tasks" in refused(parse_array, "0-50,60-110", max_tasks=100)
    assert len(parse_array("0-99999").indices) == 100_000
    refused(parse_array, "0-100000")


def test_a_huge_range_is_refused_without_being_built():
    started = time.process_time()
    assert "more than 10 tasks" in refused(parse_array, "0-20000000", max_tasks=10)  # building it: seconds
    assert time.process_time() - started < 0.5
    refused(parse_array, "0-999999999999")


_ranges = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 60), st.integers(1, 7), st.booleans()),
                   min_size=1, max_size=8)


@given(_ranges, st.none() | st.integers(1, 500))
def test_an_array_denotes_exactly_the_indices_of_its_ranges(ranges, throttle):
    terms, expected = [], set()
    for first, length, step, single in ranges:
        if single:
            terms.append(str(first))
            expected.add(first)
            continue
        last = first + length
        terms.append(f"{first}-{last}" if step == 1 and length % 2 else f"{first}-{last}:{step}")
        index = first
        while index <= last:
            expected.add(index)
            index += step
    text = ",".join(terms) + ("" if throttle is None else f"%{throttle}")
    spec = parse_array(text)
    assert spec.indices == tuple(sorted(expected))
    assert spec.max_running == throttle


# --------------------------------------------------------------------------------------------------------------
# parse_dependency


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("afterok:12:13,afterany:14",
         DependencySpec((Dependency("afterok", ("12", "13")), Dependency("afterany", ("14",))), any_of=False)),
        ("afternotok:5?afterok:6",
         DependencySpec((Dependency("afternotok", ("5",)), Dependency("afterok", ("6",))), any_of=True)),
        ("singleton", DependencySpec((Dependency("singleton", ()),), any_of=False)),
        ("afterok:123_4", DependencySpec((Dependency("afterok", ("123_4",)),), any_of=False)),
        ("after:1,singleton", DependencySpec((Dependency("after", ("1",)), Dependency("singleton", ())), any_of=False)),
    ],
)
def test_dependency_forms(text, expected):
    assert parse_dependency(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "afterok", "afterok:", "afterok:1:", "afterok::1", "afterok:x", "afterok:1_", "afterok:_4", "afterok:1_2_3",
     "afterok:-1", "afterok:1+60", "aftercorr:1", "AFTEROK:1", "singleton:1", "singleton:", "afterok:1,",
     "afterok:1??afterok:2", "afterok:1,afterok:2?afterany:3", "afterok:1 ", "expand:5"],
)
def test_malformed_dependencies_are_refused(text):
    refused(parse_dependency, text)


def test_mixing_all_of_and_any_of_says_so():
    assert "mixes ','" in refused(parse_dependency, "afterok:1?afterok:2,afterok:3")


# --------------------------------------------------------------------------------------------------------------
# parse_export, export_environment

_ENV = {"HOME": "/home/u", "PATH": "/bin", "A": "from-env", "SLURM_JOB_ID": "7"}


@pytest.mark.parametrize(
    ("text", "spec", "env"),
    [
        (None, ExportSpec(True, (), ()), _ENV),
        ("ALL", ExportSpec(True, (), ()), _ENV),
        ("all", ExportSpec(True, (), ()), _ENV),
        ("NONE", ExportSpec(False, (), ()), {}),
        ("A,PATH", ExportSpec(False, ("A", "PATH"), ()), {"A": "from-env", "PATH": "/bin"}),
        ("ALL,A=1", ExportSpec(True, (), (("A", "1"),)), {**_ENV, "A": "1"}),
        ("NONE,A=1", ExportSpec(False, (), (("A", "1"),)), {"A": "1"}),
        ("MISSING,PATH", ExportSpec(False, ("MISSING", "PATH"), ()), {"PATH": "/bin"}),
        ("B=x=y,C=", ExportSpec(False, (), (("B", "x=y"), ("C", ""))), {"B": "x=y", "C": ""}),
        ("B='a,b',_C=\"q\"", ExportSpec(False, (), (("B", "a,b"), ("_C", "q"))), {"B": "a,b", "_C": "q"}),
        ("A,A=2", ExportSpec(False, ("A",), (("A", "2"),)), {"A": "2"}),
    ],
)
def test_export_forms_and_the_environment_they_give(text, spec, env):
    assert parse_export(text) == spec
    assert export_environment(spec, _ENV) == env


@pytest.mark.parametrize("text", ["", "ALL,NONE", "none,All", "1A", "A-B", "A,,B", "A,", "=1", "A B", "ALL,B='x", "É"])
def test_malformed_exports_are_refused(text):
    refused(parse_export, text)


def test_export_environment_does_not_touch_the_submitters_environment():
    environ = dict(_ENV)
    export_environment(parse_export("ALL,A=1"), environ)
    assert environ == _ENV


# --------------------------------------------------------------------------------------------------------------
# expand_filename


def expand(pattern: str, *, job_id: str = "128", array_job_id: str | None = None, task: int | None = None) -> str:
    return expand_filename(pattern, job_id=job_id, array_job_id=array_job_id, task=task, user="ann", name="sweep")


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("slurm-%j.out", "slurm-128.out"),
        ("%x-%u-%j", "sweep-ann-128"),
        ("job%4j.out", "job0128.out"),
        ("%2j", "128"),
        ("%A_%a", "128_4294967294"),  # not an array task: Slurm's NO_VAL, as sbatch writes
        ("%b", "4"),
        ("100%%-%%j", "100%-%j"),
        ("%%%j", "%128"),
        ("%10x%3u", "sweepann"),  # widths only pad numbers
        ("%99j", "0000000128"),  # a width is cut to 10
        ("%q %5q %N %t %J", "%q %5q %N %t %J"),
        ("end%", "end%"),
        ("%12", "%12"),
        ("no-codes", "no-codes"),
        ("", ""),
        ("out\\%j", "out%j"),  # a backslash turns expansion off, and goes
        ("a\\\\b-%x", "ab-%x"),
    ],
)
def test_filename_patterns(pattern, expected):
    assert expand(pattern) == expected


def test_array_task_patterns():
    assert expand("%A_%a.out", job_id="131", array_job_id="128", task=3) == "128_3.out"
    assert expand("%A_%4a-%j", job_id="131", array_job_id="128", task=3) == "128_0003-131"
    assert expand("%b", task=17) == "7"
    assert expand("%j", job_id="128_3") == "128_3"
    assert expand("%8j", job_id="128_3") == "128_3"  # only a number is zero-padded
    assert str(NO_VAL) == "4294967294"


_literal = st.text(st.characters(codec="utf-8", exclude_characters="%\\"), max_size=4)
_code = st.tuples(st.sampled_from("jAaxub"), st.none() | st.integers(0, 14))
_pattern = st.lists(st.one_of(_literal, _code), max_size=8)
_id = st.integers(0, 10**12).map(str)


_name = st.text(st.characters(codec="utf-8", exclude_characters="%\\"), max_size=6)


@given(_pattern, _id, st.none() | _id, st.none() | st.integers(0, 10**6), _name)
def test_expanded_names_keep_no_code_and_match_an_independent_expansion(parts, job_id, array_job_id, task, name):
    pattern = "".join(p if isinstance(p, str) else f"%{'' if p[1] is None else p[1]}{p[0]}" for p in parts)
    got = expand_filename(pattern, job_id=job_id, array_job_id=array_job_id, task=task, user="ann", name=name)
    for code in ("%j", "%A", "%x"):
        assert code not in got
    expected = []
    for p in parts:
        if isinstance(p, str):
            expected.append(p)
            continue
        code, width = p
        task_id = 4294967294 if task is None else task
        value = {"j": job_id, "A": array_job_id or job_id, "a": str(task_id), "b": str(task_id % 10),
                 "x": name, "u": "ann"}[code]
        if code in "jAab" and width:
            value = value.zfill(min(width, 10))
        expected.append(value)
    assert got == "".join(expected)
