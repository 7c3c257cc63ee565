"""Job scripts read the way Slurm's sbatch reads them, for ``coorm batch job.sh``.

Users bring scripts written for Slurm; the point of this module is that such a script means here what it
means to sbatch, or is refused with a one-line reason, never silently read another way. It is pure: text
in, values out (no file, no environment, no clock), so that the command line, the batch service and the
tests share one reading.

Where it follows Slurm (checked against SchedMD's sources: ``src/sbatch/opt.c``, ``src/sbatch/sbatch.c``,
``src/common/print_fields.c``, ``src/common/env.c``):

* a script must start with ``#!``; NUL characters and DOS line breaks are refused;
* directives are the lines that *start* with ``#SBATCH`` (or ``#COORM``), read until the first line that is
  neither blank nor a comment; an unquoted ``#`` starts a comment inside a directive line too;
* ``%a`` in a file name of a job that is not an array task is Slurm's ``NO_VAL`` (4294967294), a zero-padding
  width is capped at 10, and a pattern holding a backslash is not expanded at all.

Where it does not (on purpose):

* one directive line is one argument list: an option's value cannot be on the next ``#SBATCH`` line;
* long options must be spelled in full (getopt's unambiguous prefixes such as ``--job`` are not taken);
* unknown ``#SBATCH`` options are ignored with a warning instead of failing the submission, so that scripts
  asking for what CooRM does not manage (memory, tasks, mail) still run.
"""

from __future__ import annotations

from coorm.shared.when import digits

TYPE_CHECKING = False  # (not typing's, nor collections': coorm batch imports this module on every call)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Literal, NamedTuple

    Dialect = Literal["coorm", "sbatch"]
    DependencyKind = Literal["after", "afterok", "afterany", "afternotok", "singleton"]
else:
    from coorm.shared.records import NamedTuple

__all__ = [
    "ArraySpec",
    "Dependency",
    "DependencySpec",
    "ExportSpec",
    "JobOptions",
    "ScriptError",
    "expand_filename",
    "export_environment",
    "parse_array",
    "parse_dependency",
    "parse_export",
    "parse_options",
    "parse_script",
]


NO_VAL = 4294967294  # Slurm's "no value" (0xfffffffe): what its %a writes for a job that is not an array task
MAX_PAD = 10  # Slurm's MAX_WIDTH: a longer zero-padding width is cut to this


class ScriptError(ValueError):
    """A refusal: a one-line message naming the line and/or the option at fault."""


class JobOptions(NamedTuple):
    """What a script's directives or a command line ask for. ``None`` means "not given", so that options
    from several sources can be layered with :meth:`merged`."""

    nodes: int | None = None
    time: str | None = None  # kept as text: the caller owns walltime parsing
    name: str | None = None
    output: str | None = None
    error: str | None = None
    array: str | None = None  # checked for syntax here; see parse_array (its size limit is the caller's)
    dependency: str | None = None
    chdir: str | None = None
    export: str | None = None
    cluster: str | None = None
    hold: bool | None = None

    def merged(self, override: JobOptions) -> JobOptions:
        """These options with every field ``override`` gives replacing ours."""
        return self._replace(**{k: v for k, v in override._asdict().items() if v is not None})


# ---------------------------------------------------------------------------------------------------------------
# options

# long name -> JobOptions field; both dialects
_LONG: dict[str, str] = {
    "nodes": "nodes",
    "time": "time",
    "job-name": "name",
    "output": "output",
    "error": "error",
    "array": "array",
    "dependency": "dependency",
    "chdir": "chdir",
    "export": "export",
    "partition": "cluster",
    "hold": "hold",
}
_SHORT: dict[str, str] = {
    "N": "nodes",
    "t": "time",
    "J": "name",
    "o": "output",
    "e": "error",
    "a": "array",
    "d": "dependency",
    "D": "chdir",
    "p": "cluster",
    "H": "hold",
}
# -c means --cpus-per-task to sbatch: only where no Slurm script can be misread does it name a cluster
_COORM_LONG: dict[str, str] = {**_LONG, "cluster": "cluster"}
_COORM_SHORT: dict[str, str] = {**_SHORT, "c": "cluster"}
_FLAG_FIELDS = frozenset({"hold"})

# To skip an ignored sbatch option we must know whether the next word is its value. These are sbatch's
# options without a required argument (Slurm's src/common/slurm_opt.c, sbatch's table); any other long one
# is taken to have a value, skipped unless it looks like an option: for a name sbatch does not know either,
# a wrong guess must not swallow the next real option.
_SBATCH_LONG_FLAGS = frozenset({
    "consolidate-segments", "contiguous", "exclusive", "external", "get-user-env", "help", "hold", "ignore-pbs",
    "nice", "no-kill", "no-requeue", "oom-kill-step", "overcommit", "oversubscribe", "parsable", "propagate",
    "quiet", "reboot", "requeue", "resv-ports", "spread-job", "spread-segments", "stepmgr", "test-only", "usage",
    "use-min-nodes", "verbose", "version", "wait",
})  # fmt: skip
_SBATCH_SHORT_VALUED = frozenset("ABCDFGJLMNSabcdeimnopqtwx")


def parse_options(argv: list[str], *, dialect: Dialect) -> tuple[JobOptions, list[str]]:
    """Read options given as an argument list (a command line, or one directive line split into words).

    ``-N 4``, ``-N4``, ``--nodes 4`` and ``--nodes=4`` all work, short flags may be grouped (``-HN4``) and a
    later option wins over an earlier one, as with getopt. Options CooRM does not know are a
    :class:`ScriptError` in the ``coorm`` dialect; in the ``sbatch`` dialect they are skipped (with their
    value) and reported in the returned warnings. A word that is not an option is an error in both."""
    return _read_options(argv, dialect, "")


def _read_options(argv: Sequence[str], dialect: Dialect, where: str) -> tuple[JobOptions, list[str]]:
    long_table = _COORM_LONG if dialect == "coorm" else _LONG
    short_table = _COORM_SHORT if dialect == "coorm" else _SHORT
    texts: dict[str, str] = {}
    nodes: int | None = None
    hold: bool | None = None
    warnings: list[str] = []

    def take(field: str, spelled: str, value: str) -> None:
        nonlocal nodes
        checked = _check_value(field, spelled, value, where)
        if field == "nodes":
            nodes = int(checked)
        else:
            texts[field] = checked

    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("--") and len(arg) > 2:
            name, eq, attached = arg[2:].partition("=")
            spelled = "--" + name
            field = long_table.get(name)
            if field is None:
                if dialect == "coorm":
                    raise ScriptError(f"{where}unknown option {spelled}")
                if not eq and name not in _SBATCH_LONG_FLAGS and i < len(argv) and not argv[i].startswith("-"):
                    i += 1  # its value: "--mem 4G"
                warnings.append(_ignored(where, spelled))
            elif field in _FLAG_FIELDS:
                if eq:
                    raise ScriptError(f"{where}{spelled} takes no value (got {attached!r})")
                hold = True
            elif eq:
                take(field, spelled, attached)
            elif i < len(argv):
                take(field, spelled, argv[i])  # getopt takes the next word even if it starts with '-'
                i += 1
            else:
                raise ScriptError(f"{where}{spelled} needs a value")
        elif arg.startswith("-") and arg not in ("-", "--"):
            j = 1
            while j < len(arg):
                letter = arg[j]
                j += 1
                spelled = "-" + letter
                field = short_table.get(letter)
                if field is None:
                    if dialect == "coorm":
                        raise ScriptError(f"{where}unknown option {spelled}")
                    if letter in _SBATCH_SHORT_VALUED:
                        if j == len(arg) and i < len(argv):
                            i += 1
                        j = len(arg)
                    warnings.append(_ignored(where, spelled))
                elif field in _FLAG_FIELDS:
                    hold = True
                elif j < len(arg):
                    take(field, spelled, arg[j:])
                    j = len(arg)
                elif i < len(argv):
                    take(field, spelled, argv[i])
                    i += 1
                else:
                    raise ScriptError(f"{where}{spelled} needs a value")
        elif arg.lower() in ("hetjob", "packjob"):
            raise ScriptError(f"{where}heterogeneous jobs ({arg!r}) are not supported")
        else:
            raise ScriptError(f"{where}unexpected argument {arg!r} (not an option)")

    options = JobOptions(
        nodes=nodes,
        time=texts.get("time"),
        name=texts.get("name"),
        output=texts.get("output"),
        error=texts.get("error"),
        array=texts.get("array"),
        dependency=texts.get("dependency"),
        chdir=texts.get("chdir"),
        export=texts.get("export"),
        cluster=texts.get("cluster"),
        hold=hold,
    )
    return options, warnings


def _ignored(where: str, spelled: str) -> str:
    if spelled in ("-c", "--cpus-per-task"):
        return (f"{where}{spelled} (--cpus-per-task) ignored: CooRM allocates whole nodes; "
                "to pick a cluster use -p/--partition or '#COORM -c'")
    return f"{where}{spelled} ignored: not an option CooRM supports"


def _name(text: str) -> bool:
    """``[A-Za-z_][A-Za-z0-9_]*``: a shell variable's name."""
    return text.isascii() and (text[:1].isalpha() or text[:1] == "_") and text.replace("_", "a").isalnum()


def _check_value(field: str, spelled: str, value: str, where: str) -> str:
    """The value, checked now so that a mistake is reported with its line rather than at submission."""
    if value == "":
        raise ScriptError(f"{where}{spelled} needs a value")
    try:
        if field == "nodes":
            first, dash, last = value.partition("-")
            if dash and digits(first) and (last == "" or digits(last)):
                raise ScriptError(f"node count ranges not supported ({value!r}): give one number")
            if not digits(value) or int(value) == 0:
                raise ScriptError(f"invalid node count {value!r}: a positive integer is needed")
        elif field == "array":
            _array_terms(value)
        elif field == "dependency":
            parse_dependency(value)
        elif field == "export":
            parse_export(value)
    except ScriptError as e:
        raise ScriptError(f"{where}{spelled}: {e}") from None
    return value


# ---------------------------------------------------------------------------------------------------------------
# scripts

# sbatch still reads the pre-2.0 "#SLURM" as "#SBATCH" (with a complaint): ignoring it would misread old scripts
_MAGIC: tuple[tuple[str, Dialect], ...] = (("#COORM", "coorm"), ("#SBATCH", "sbatch"), ("#SLURM", "sbatch"))
_MAGIC_WORDS = tuple(word for word, _ in _MAGIC)
_C_SPACE = " \t\v\f\r"  # C's isspace() without the newline, which sbatch uses to tell a blank line


def parse_script(text: str) -> tuple[JobOptions, list[str]]:
    """Directives are read, as sbatch does, from comment lines '#COORM ...' or '#SBATCH ...' at the top of
    the script, after the optional '#!' line, up to the first line that is neither blank nor a comment.

    Each directive line may hold several options, split with shlex (quotes group words, an unquoted '#'
    starts a comment). Both '-N 4', '-N4', '--nodes 4', '--nodes=4' forms. #COORM wins over #SBATCH when
    both give the same option (whatever the order); within one kind, the later line wins. Unknown #SBATCH
    options (e.g. --mem, --ntasks, --mail-user, -c) are ignored and returned as warnings (one-line
    strings); unknown #COORM options are a ScriptError. A script must start with '#!' (as sbatch
    requires): else ScriptError.

    The old '#SLURM' prefix is read as '#SBATCH', as sbatch does, with a warning. Warnings are also given
    for a directive indented (sbatch does not read it) or after the first command (sbatch ignores it), since
    either usually means the author expected it to count."""
    if not text.startswith("#!"):
        raise ScriptError("line 1: a job script must start with '#!' and an interpreter (#!/bin/bash), as for sbatch")
    if "\0" in text:
        raise ScriptError(f"line {text.count(chr(10), 0, text.index(chr(0))) + 1}: NUL character in the script")
    if "\r\n" in text:
        at = text.count("\n", 0, text.index("\r\n")) + 1
        raise ScriptError(f"line {at}: DOS line break (\\r\\n); convert the script to Unix line breaks (dos2unix)")

    by_dialect: dict[Dialect, JobOptions] = {"coorm": JobOptions(), "sbatch": JobOptions()}
    warnings: list[str] = []
    first_command: int | None = None
    for number, line in enumerate(text.split("\n")[1:], start=2):
        magic = next(((word, dialect) for word, dialect in _MAGIC if line.startswith(word)), None)
        if first_command is not None:
            if magic is not None:
                warnings.append(f"line {number}: {magic[0]} after the first command (line {first_command}) is ignored")
            continue
        if magic is None:
            body = line.lstrip(_C_SPACE)
            if body.startswith(_MAGIC_WORDS):
                word = body.split()[0]
                warnings.append(f"line {number}: indented {word} is not a directive (it must start the line)")
            elif body and not body.startswith("#"):
                first_command = number
            continue
        word, dialect = magic
        where = f"line {number}: {word} "
        if word == "#SLURM" and not any("#SLURM is" in w for w in warnings):
            warnings.append(f"line {number}: #SLURM is read as #SBATCH, as sbatch does; write #SBATCH")
        import shlex  # (only for a script's directives)

        try:
            argv = shlex.split(line[len(word):], comments=True)
        except ValueError as e:  # an unbalanced quote
            raise ScriptError(f"{where}cannot be split: {e}") from None
        options, found = _read_options(argv, dialect, where)
        by_dialect[dialect] = by_dialect[dialect].merged(options)
        warnings.extend(found)
    return by_dialect["sbatch"].merged(by_dialect["coorm"]), warnings


# ---------------------------------------------------------------------------------------------------------------
# --array

class ArraySpec(NamedTuple):
    indices: tuple[int, ...]  # sorted, unique
    max_running: int | None  # the '%N' throttle


def _array_term(term: str) -> tuple[int, int, int] | None:
    """``N``, ``N-M`` or ``N-M:S``: (first, last, step), or None."""
    span, colon, step = term.partition(":")
    first, dash, last = span.partition("-")
    if not digits(first) or (dash and not digits(last)) or (colon and not (dash and digits(step))):
        return None
    return int(first), int(last) if dash else int(first), int(step) if colon else 1


def _array_terms(text: str) -> tuple[list[range], int | None]:
    """The ranges and throttle an --array text names, syntax checked, without enumerating anything (a text
    can name billions of indices)."""
    if text == "":
        raise ScriptError("empty array specification")
    body, percent, throttle_text = text.partition("%")
    max_running: int | None = None
    if percent:
        if not digits(throttle_text):
            raise ScriptError(f"invalid array throttle {'%' + throttle_text!r} in {text!r}: '%N', N a positive integer")
        max_running = int(throttle_text)
        if max_running == 0:
            raise ScriptError(f"array throttle %0 in {text!r} would never run a task")
    ranges: list[range] = []
    for term in body.split(","):
        parsed = _array_term(term)
        if parsed is None:
            raise ScriptError(f"invalid array term {term!r} in {text!r}: expected N, N-M or N-M:S")
        first, last, step = parsed
        if last < first:
            raise ScriptError(f"array range {term!r} in {text!r} ends before it starts")
        if step == 0:
            raise ScriptError(f"array step 0 in {term!r} of {text!r}: the step must be positive")
        ranges.append(range(first, last + 1, step))
    return ranges, max_running


def parse_array(text: str, *, max_tasks: int = 100_000) -> ArraySpec:
    """Slurm's --array forms: "0-999", "0-999%50", "1,3,7", "1-9:2" (step), "0-15:4%2" and mixes
    "1,4-6,10-20:5%3". No spaces, no negative index. More than ``max_tasks`` tasks, an empty or malformed
    text, a range ending before it starts, a step of 0 or a throttle of 0: ScriptError."""
    ranges, max_running = _array_terms(text)
    indices: set[int] = set()
    for r in ranges:
        if len(r) > max_tasks:  # before enumerating it: "0-4000000000" must not be built
            raise ScriptError(f"array {text!r} has more than {max_tasks} tasks")
        indices.update(r)
        if len(indices) > max_tasks:
            raise ScriptError(f"array {text!r} has more than {max_tasks} tasks")
    return ArraySpec(indices=tuple(sorted(indices)), max_running=max_running)


# ---------------------------------------------------------------------------------------------------------------
# --dependency

class Dependency(NamedTuple):
    kind: DependencyKind
    jobs: tuple[str, ...]  # job ids as given: "123" or an array task "123_4"; empty for singleton


class DependencySpec(NamedTuple):
    terms: tuple[Dependency, ...]
    any_of: bool  # '?' separated the terms: one satisfied is enough; else all must be (one term: False)


_KINDS: tuple[DependencyKind, ...] = ("after", "afterok", "afterany", "afternotok", "singleton")
def _job_id(text: str) -> bool:
    """``123`` or an array task's ``123_4``."""
    job, underscore, task = text.partition("_")
    return digits(job) and (not underscore or digits(task))


def parse_dependency(text: str) -> DependencySpec:
    """"afterok:12:13,afterany:14" (all of), "afternotok:5?afterok:6" (any of), "singleton",
    "afterok:123_4" (an array task). Mixing ',' and '?' is refused, as Slurm does; so are the kinds CooRM
    does not implement (aftercorr, afterburstbuffer, expand) and Slurm's "+minutes" delays."""
    if text == "":
        raise ScriptError("empty dependency")
    if "," in text and "?" in text:
        raise ScriptError(f"dependency {text!r} mixes ',' (all of) and '?' (any of)")
    any_of = "?" in text
    terms: list[Dependency] = []
    for term in text.split("?" if any_of else ","):
        kind, _, ids = term.partition(":")
        kind_ok = next((k for k in _KINDS if k == kind), None)
        if kind_ok is None:
            raise ScriptError(f"unknown dependency type {kind!r} in {text!r} (known: {', '.join(_KINDS)})")
        if kind_ok == "singleton":
            if ids or term != "singleton":
                raise ScriptError(f"'singleton' takes no job ids (in {text!r})")
            terms.append(Dependency("singleton", ()))
            continue
        if not ids:
            raise ScriptError(f"dependency {term!r} in {text!r} names no job")
        jobs = tuple(ids.split(":"))
        for job in jobs:
            if not _job_id(job):
                raise ScriptError(f"invalid job id {job!r} in dependency {text!r}: expected 123 or 123_4")
        terms.append(Dependency(kind_ok, jobs))
    return DependencySpec(terms=tuple(terms), any_of=any_of)


# ---------------------------------------------------------------------------------------------------------------
# --export

class ExportSpec(NamedTuple):
    inherit: bool  # the submitter's whole environment (ALL, the default) or none of it
    names: tuple[str, ...]  # variables taken from the submitter's environment (VAR)
    values: tuple[tuple[str, str], ...]  # VAR=value given explicitly


def parse_export(text: str | None) -> ExportSpec:
    """None / "ALL" -> everything; "NONE" -> nothing; "A,B" -> only A and B; "ALL,A=1" -> everything plus
    A=1; "NONE,A=1" -> only A=1. ALL and NONE are case-insensitive (as in Slurm). Items are split at commas
    outside quotes, and a value wholly in quotes loses them, so "A='x,y'" sets A to x,y. An invalid
    variable name, an empty item, or ALL with NONE: ScriptError.

    Slurm also always passes its own SLURM_* variables and, for NONE, loads the user's login environment
    on the node; here the job gets exactly what is listed, and the caller adds CooRM's own variables."""
    if text is None:
        return ExportSpec(inherit=True, names=(), values=())
    items = _split_unquoted(text)
    keywords = {item.upper() for item in items if item.upper() in ("ALL", "NONE")}
    if keywords == {"ALL", "NONE"}:
        raise ScriptError(f"export {text!r} gives both ALL and NONE")
    names: list[str] = []
    values: list[tuple[str, str]] = []
    for item in items:
        if item.upper() in ("ALL", "NONE"):
            continue
        name, eq, value = item.partition("=")
        if not _name(name):
            what = "empty item" if item == "" else f"invalid variable name {name!r}"
            raise ScriptError(f"{what} in export {text!r}")
        if eq:
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values.append((name, value))
        else:
            names.append(name)
    return ExportSpec(inherit="ALL" in keywords, names=tuple(names), values=tuple(values))


def _split_unquoted(text: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    quote = ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    if quote:
        raise ScriptError(f"unbalanced {quote} in export {text!r}")
    items.append("".join(current))
    return items


def export_environment(spec: ExportSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the job gets from the submitter's ``environ``. A listed name the submitter does not
    have is left out (as Slurm does); an explicit value wins over an inherited one."""
    env = dict(environ) if spec.inherit else {}
    for name in spec.names:
        if name in environ:
            env[name] = environ[name]
    env.update(spec.values)
    return env


# ---------------------------------------------------------------------------------------------------------------
# file names

_PADDED = frozenset("jAab")  # numeric fields: Slurm zero-pads these and ignores a width on the others


def expand_filename(pattern: str, *, job_id: str, array_job_id: str | None, task: int | None, user: str,
                    name: str) -> str:
    """Expand Slurm's --output/--error patterns: %j job id, %A the array's (master) job id (the job id when
    not an array task), %a the task index, %b the task index modulo 10, %u user, %x job name, %% a percent.
    A width (``%4a``) zero-pads a numeric field, up to 10 digits; a width on %u or %x is ignored.

    As in sbatch, ``%a``/``%b`` of a job that is not an array task give Slurm's NO_VAL (4294967294 / 4):
    a script written for Slurm names the same files here. A pattern holding a backslash is not expanded at
    all and loses its backslashes ("out\\%j" -> "out%j"), Slurm's way to ask for a literal name.

    Any other ``%c`` (including Slurm's node- and step-level %N %n %s %t %J, which have no meaning for a
    CooRM batch job) is left as it is, width included; so is a '%' ending the pattern (Slurm drops that
    one, which only hides a typo)."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    task_value = NO_VAL if task is None else task
    fields_by_code = {
        "j": job_id,
        "A": job_id if array_job_id is None else array_job_id,
        "a": str(task_value),
        "b": str(task_value % 10),
        "u": user,
        "x": name,
    }
    out: list[str] = []
    i = 0
    while i < len(pattern):
        percent = pattern.find("%", i)
        if percent < 0:
            out.append(pattern[i:])
            break
        out.append(pattern[i:percent])
        j = percent + 1
        if j < len(pattern) and pattern[j] == "%":
            out.append("%")
            i = j + 1
            continue
        k = j
        while k < len(pattern) and pattern[k] in "0123456789":
            k += 1
        code = pattern[k] if k < len(pattern) else ""
        value = fields_by_code.get(code) if code else None
        if value is None:
            out.append(pattern[percent:k + 1])
        else:
            width = min(int(pattern[j:k]), MAX_PAD) if k > j else 0
            # a CooRM id may be more than digits ("123_4"); Slurm's padding is numeric, so pad only numbers
            if code in _PADDED and value.isascii() and value.isdigit():
                value = value.rjust(width, "0")
            out.append(value)
        i = k + 1
    return "".join(out)
