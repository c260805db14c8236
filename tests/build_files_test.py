"""Keeps the Bazel BUILD files true to the Python sources they describe.

Bazel cannot fetch its Python rules offline here, so this test stands in for
`bazel build //...`. It reads every BUILD file with Python's `ast` (the
Starlark they use is Python syntax) and checks that:

1. every .py file under the source folders is a src of exactly one py_*
   target of its Bazel package (the nearest folder upwards with a BUILD
   file), and every listed src exists and lies in that package;
2. every *_test.py file is a src of a py_test, py_test srcs are all test
   files, and the `main` of a py_test or py_binary (name + '.py' unless
   given) is one of its srcs;
3. every dep label names a target that exists; "@..." labels are external;
4. deps are exactly what the srcs import. A project module imported
   (`import tff_fedrec.x`, `from tff_fedrec.tasks import y`, relative
   imports too) must be in the same target or in a py_library listed in
   deps, and every listed project dep must be imported. Likewise each
   imported third-party module needs an "@hub//distribution" dep of a
   distribution that provides it, and every such dep must be imported;
5. target names are unique within a BUILD file, and labels within a deps
   list.

Only the module named by an import counts, not the packages above it whose
`__init__.py` Python also runs, since Bazel puts those on the path itself.
The checker reads literal values only: `srcs = glob([...])` is reported, not
evaluated. The checker lives in this module rather than beside it because
pytest's importlib mode does not put tests/ on the path.
"""

import ast
import collections
import dataclasses
import importlib.metadata
import posixpath
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

PY_RULES = ('py_library', 'py_binary', 'py_test')


@dataclasses.dataclass(frozen=True)
class Target:
  """A target of a BUILD file; srcs are paths from the repository root."""

  kind: str
  package: str
  name: str
  srcs: tuple[str, ...] = ()
  deps: tuple[str, ...] = ()
  main: str | None = None

  @property
  def label(self) -> str:
    return f'//{self.package}:{self.name}'


@dataclasses.dataclass(frozen=True)
class Import:
  """A project file or third-party top-level module that a file imports."""

  line: int
  module: str
  project_file: str | None = None


def _join(package: str, name: str) -> str:
  return f'{package}/{name}' if package else name


def _build_file(package: str) -> str:
  return _join(package, 'BUILD')


def _is_test_file(path: str) -> bool:
  return path.endswith('_test.py')


def _is_string_list(value) -> bool:
  return isinstance(value, list) and all(isinstance(v, str) for v in value)


def parse_build_file(
    root: Path, package: str
) -> tuple[list[Target], list[str]]:
  """The targets a BUILD file defines, and the problems reading it.

  Any top-level call with a string `name` defines a target, so deps on a
  filegroup or alias resolve; only py_* rules have their srcs, deps and
  main read. Calls without a name (load, package, exports_files) define
  none.
  """
  path = _build_file(package)
  try:
    tree = ast.parse((root / path).read_text(), filename=path)
  except SyntaxError as error:
    return [], [f'{path}:{error.lineno}: not Python syntax: {error.msg}']
  targets, problems = [], []
  for statement in tree.body:
    call = statement.value if isinstance(statement, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
      continue
    kind, where = call.func.id, f'{path}:{call.lineno}'
    fields = ('name', 'srcs', 'deps', 'main') if kind in PY_RULES else ('name',)
    keywords = {k.arg: k.value for k in call.keywords if k.arg in fields}
    try:
      values = {f: ast.literal_eval(v) for f, v in keywords.items()}
    except ValueError:
      problems.append(
          f'{where}: {kind}: {", ".join(fields)} must be '
          'literals for this check to read them'
      )
      continue
    name = values.get('name')
    if not isinstance(name, str):
      if kind in PY_RULES:
        problems.append(f'{where}: {kind} has no string name')
      continue
    if kind not in PY_RULES:
      targets.append(Target(kind, package, name))
      continue
    srcs, deps = values.get('srcs', []), values.get('deps', [])
    if not (_is_string_list(srcs) and _is_string_list(deps)):
      problems.append(
          f'{where}: {kind} {name}: srcs and deps must be lists of strings'
      )
      continue
    for src in srcs:
      if src.startswith(('//', '@')) or not src.endswith('.py'):
        problems.append(
            f'{where}: {kind} {name}: src "{src}" is not '
            'a .py file of this package'
        )
    srcs = [
        posixpath.normpath(_join(package, src.removeprefix(':')))
        for src in srcs
        if src.endswith('.py') and not src.startswith(('//', '@'))
    ]
    targets.append(
        Target(
            kind, package, name, tuple(srcs), tuple(deps), values.get('main')
        )
    )
  return targets, problems


def resolve_label(label: str, package: str) -> str | None:
  """'//package:name' for a label written in `package`; None if external.

  ":name" and "name" are relative to `package`; "//pkg" is "//pkg:pkg".
  """
  if label.startswith('@'):
    return None
  if label.startswith('//'):
    label_package, _, name = label[2:].partition(':')
    return f'//{label_package}:{name or label_package.split("/")[-1]}'
  return f'//{package}:{label.removeprefix(":")}'


def _walk(root: Path, source_dirs: Sequence[str]) -> tuple[set[str], list[str]]:
  """The packages (folders with a BUILD file) and .py files, from root."""
  packages = {''} if (root / 'BUILD').is_file() else set()
  # A set, since a source folder may lie inside another.
  py_files = set()
  for source_dir in source_dirs:
    for folder in sorted((root / source_dir).glob('**/')):
      relative = folder.relative_to(root)
      if any(
          part.startswith('.') or part == '__pycache__'
          for part in relative.parts
      ):
        continue
      if (folder / 'BUILD').is_file():
        packages.add(relative.as_posix())
      py_files.update(
          f.relative_to(root).as_posix() for f in folder.glob('*.py')
      )
  return packages, sorted(py_files)


def owning_package(path: str, packages: set[str]) -> str | None:
  """The Bazel package of a file: its nearest folder with a BUILD file."""
  folder = posixpath.dirname(path)
  while folder not in packages:
    if not folder:
      return None
    folder = posixpath.dirname(folder)
  return folder


def _longest_prefix(module: str, package_dirs: Mapping[str, str]):
  return max(
      (p for p in package_dirs if module == p or module.startswith(p + '.')),
      key=len,
      default=None,
  )


def module_file(
    root: Path, module: str, package_dirs: Mapping[str, str]
) -> str | None:
  """The repository file of a project module, or None if there is none.

  `package_dirs` maps package names to folders as pyproject's
  `package-dir` does, e.g. {'tff_fedrec.tasks': 'tasks'}.
  """
  prefix = _longest_prefix(module, package_dirs)
  if prefix is None:
    return None
  path = _join(
      package_dirs[prefix], module[len(prefix) + 1 :].replace('.', '/')
  ).rstrip('/')
  candidates = [f'{path}/__init__.py']
  if module != prefix:
    candidates.insert(0, f'{path}.py')
  return next((c for c in candidates if (root / c).is_file()), None)


def _file_package(path: str, package_dirs: Mapping[str, str]) -> str | None:
  """The Python package a file's relative imports start from."""
  folder = posixpath.dirname(path)
  containing = [
      (package_dir, package)
      for package, package_dir in package_dirs.items()
      if folder == package_dir or folder.startswith(package_dir + '/')
  ]
  if not containing:
    return None
  package_dir, package = max(containing)
  rest = folder[len(package_dir) :].strip('/').replace('/', '.')
  return f'{package}.{rest}' if rest else package


def file_imports(
    root: Path, path: str, package_dirs: Mapping[str, str]
) -> tuple[list[Import], list[str]]:
  """The project files and third-party modules a file imports.

  Standard-library modules are left out. `from a import b` imports the
  module a.b if it is a project file, else a (b is a name defined in a).

  Returns:
    (imports, problems): project imports carry `project_file`; third-party
    ones carry only their top-level module.
  """
  try:
    tree = ast.parse((root / path).read_text(), filename=path)
  except SyntaxError as error:
    return [], [f'{path}:{error.lineno}: not Python syntax: {error.msg}']
  project_tops = {p.split('.')[0] for p in package_dirs}
  imports, problems = [], []

  def add(line: int, module: str, names: Sequence[str] = ()):
    top = module.split('.')[0]
    if top in sys.stdlib_module_names:
      return
    if top not in project_tops:
      imports.append(Import(line, top))
      return
    found = [
        (
            f'{module}.{name}',
            module_file(root, f'{module}.{name}', package_dirs),
        )
        for name in names
    ]
    if not names or not all(file for _, file in found):
      found = [(m, file) for m, file in found if file] + [
          (module, module_file(root, module, package_dirs))
      ]
    for found_module, file in found:
      if file is None:
        problems.append(
            f'{path}:{line}: imports {found_module}, '
            'which is no file of the repository'
        )
      else:
        imports.append(Import(line, found_module, file))

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        add(node.lineno, alias.name)
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ''
      if node.level:
        package = _file_package(path, package_dirs)
        if package is None or node.level > package.count('.') + 1:
          problems.append(
              f'{path}:{node.lineno}: relative import outside a project package'
          )
          continue
        base = package.rsplit('.', node.level - 1)[0]
        module = f'{base}.{module}' if module else base
      add(node.lineno, module, [a.name for a in node.names if a.name != '*'])
  return imports, problems


def _normalize_distribution(name: str) -> str:
  # rules_python names a distribution's repository this way.
  return re.sub(r'[-_.]+', '_', name).lower()


def _check_third_party(
    target: Target,
    imports: list[tuple[str, Import]],
    distributions: Mapping[str, Sequence[str]],
) -> list[str]:
  problems = []
  listed = {}
  for dep in target.deps:
    if dep.startswith('@'):
      distribution = dep.partition('//')[2].split(':')[0]
      if not distribution:
        problems.append(
            f'{target.label}: dep "{dep}" is not of the '
            'form "@hub//distribution"'
        )
      else:
        listed[_normalize_distribution(distribution)] = dep
  used = set()
  for src, imported in imports:
    if imported.project_file is not None:
      continue
    providers = {
        _normalize_distribution(d)
        for d in distributions.get(imported.module, ())
    }
    if not providers:
      problems.append(
          f'{src}:{imported.line}: imports '
          f'{imported.module}, which no installed '
          'distribution provides'
      )
    elif providers.isdisjoint(listed):
      problems.append(
          f'{src}:{imported.line}: imports {imported.module}, but the '
          f'deps of {target.label} name none of its distributions '
          f'({", ".join(sorted(providers))}), e.g. '
          f'"@pypi//{min(providers)}"'
      )
    used |= providers
  for distribution, dep in listed.items():
    if distribution not in used:
      problems.append(
          f'{target.label}: dep "{dep}" is imported by none of its srcs'
      )
  return problems


def check_repository(
    root: Path,
    *,
    package_dirs: Mapping[str, str],
    source_dirs: Sequence[str],
    distributions: Mapping[str, Sequence[str]],
) -> list[str]:
  """Every way the BUILD files disagree with the sources; [] if none.

  Args:
    root: the repository root.
    package_dirs: Python package name -> folder from root, as pyproject's
      `package-dir`.
    source_dirs: the folders from root whose .py files must be in targets.
    distributions: top-level module -> names of the distributions that
      provide it, as `importlib.metadata.packages_distributions()`.

  Returns:
    One line per problem, each starting with the file it is about.
  """
  problems = [
      f'{_build_file(p)}: missing (the root and every source folder need '
      'a BUILD file)'
      for p in ['', *source_dirs]
      if not (root / _build_file(p)).is_file()
  ]
  packages, py_files = _walk(root, source_dirs)
  targets = []
  for package in sorted(packages):
    package_targets, package_problems = parse_build_file(root, package)
    targets += package_targets
    problems += package_problems

  by_label = {}
  for target in targets:
    if target.label in by_label:
      problems.append(
          f'{_build_file(target.package)}: more than one '
          f'target is named "{target.name}"'
      )
    by_label.setdefault(target.label, target)
  py_targets = [t for t in targets if t.kind in PY_RULES]

  owners = collections.defaultdict(list)
  for target in py_targets:
    for src in target.srcs:
      owners[src].append(target)
      if not (root / src).is_file():
        problems.append(f'{target.label}: src {src} does not exist')
      elif owning_package(src, packages) != target.package:
        problems.append(
            f'{target.label}: src {src} belongs to package '
            f'//{owning_package(src, packages)}'
        )
      if target.kind == 'py_test' and not _is_test_file(src):
        problems.append(
            f'{target.label}: src {src} of a py_test is not a *_test.py file'
        )
    if target.kind != 'py_library':
      main = _join(
          target.package, (target.main or f'{target.name}.py').removeprefix(':')
      )
      if main not in target.srcs:
        problems.append(f'{target.label}: main {main} is not one of its srcs')
  for path in py_files:
    labels = ', '.join(t.label for t in owners[path])
    if not owners[path]:
      package = owning_package(path, packages)
      problems.append(
          f'{path}: in the srcs of no target'
          + (
              f' of {_build_file(package)}'
              if package is not None
              else ', and no BUILD file is above it'
          )
      )
    elif len(owners[path]) > 1:
      problems.append(f'{path}: in the srcs of more than one target: {labels}')
    if _is_test_file(path) and any(t.kind != 'py_test' for t in owners[path]):
      problems.append(
          f'{path}: a test file in the srcs of {labels}; '
          'test files belong to py_test targets'
      )

  imports_by_file = {}
  for path in sorted({src for t in py_targets for src in t.srcs}):
    if (root / path).is_file():
      imports_by_file[path], file_problems = file_imports(
          root, path, package_dirs
      )
      problems += file_problems

  for target in py_targets:
    deps = {}
    for dep in target.deps:
      key = resolve_label(dep, target.package) or dep
      if key in deps:
        problems.append(f'{target.label}: dep "{dep}" is listed twice')
      deps[key] = dep
      if not dep.startswith('@') and key not in by_label:
        problems.append(f'{target.label}: dep "{dep}" names no target')
    imports = [
        (src, imported)
        for src in target.srcs
        for imported in imports_by_file.get(src, ())
    ]
    needed = set()
    for src, imported in imports:
      file_owners = owners.get(imported.project_file)
      # A file in no target is reported above, with its fix.
      if not file_owners or file_owners[0] is target:
        continue
      owner = file_owners[0]
      needed.add(owner.label)
      where = f'{src}:{imported.line}: imports {imported.module}'
      if owner.kind != 'py_library':
        problems.append(
            f'{where}, which is in {owner.kind} {owner.label}; only '
            'a py_library can be a dep'
        )
      elif owner.label not in deps:
        problems.append(
            f'{where}, but {owner.label} is not in the deps of {target.label}'
        )
    for key, dep in deps.items():
      if key in by_label and key not in needed:
        problems.append(
            f'{target.label}: dep "{dep}" is imported by none of its srcs'
        )
    problems += _check_third_party(target, imports, distributions)
  return problems


def test_repository_build_files_are_true():
  root = Path(__file__).resolve().parent.parent
  pyproject = tomllib.loads((root / 'pyproject.toml').read_text())
  package_dirs = pyproject['tool']['setuptools']['package-dir']
  problems = check_repository(
      root,
      package_dirs=package_dirs,
      source_dirs=sorted({*package_dirs.values(), 'tests'}),
      distributions=importlib.metadata.packages_distributions(),
  )
  assert not problems, (
      f'The BUILD files disagree with the sources in {len(problems)} ways:\n'
      + '\n'.join(problems)
  )


# A small repository that satisfies every check: package `proj` in proj/,
# `proj.tasks` in tasks/, and end-to-end tests in tests/.
_PACKAGE_DIRS = {'proj': 'proj', 'proj.tasks': 'tasks'}
_SOURCE_DIRS = ('proj', 'tasks', 'tests')
_DISTRIBUTIONS = {'numpy': ['numpy'], 'absl': ['absl-py'], 'pytest': ['pytest']}
_GOOD_TREE = {
    'BUILD': 'package(default_visibility = ["//visibility:public"])\n',
    'proj/BUILD': (
        """
load("@rules_python//python:defs.bzl", "py_library", "py_test")

py_library(
    name = "proj",
    srcs = ["__init__.py"],
)

py_library(
    name = "scores",
    srcs = ["scores.py"],
    deps = ["@pypi//numpy"],
)

py_library(
    name = "ranking",
    srcs = ["ranking.py", "_sort.py"],
    deps = [":scores"],
)

py_test(
    name = "ranking_test",
    size = "small",
    srcs = ["ranking_test.py"],
    deps = [":ranking", "@pypi//pytest"],
)
"""
    ),
    'proj/__init__.py': '',
    'proj/scores.py': 'import numpy as np\n',
    'proj/ranking.py': (
        'import os\nfrom proj import scores\nfrom . import _sort\n'
    ),
    'proj/_sort.py': '',
    'proj/ranking_test.py': 'import pytest\nfrom proj.ranking import rank\n',
    'tasks/BUILD': (
        """
py_library(
    name = "tasks",
    srcs = ["__init__.py"],
)

py_library(
    name = "data",
    srcs = ["data.py"],
    deps = ["//proj:scores", "@pypi//absl-py"],
)

py_binary(
    name = "prepare",
    srcs = ["prepare.py"],
    deps = [":data"],
)
"""
    ),
    'tasks/__init__.py': '',
    'tasks/data.py': 'from absl import logging\nimport proj.scores\n',
    'tasks/prepare.py': 'from . import data\n',
    'tests/BUILD': (
        """
py_test(
    name = "end_to_end_test",
    srcs = ["end_to_end_test.py"],
    deps = ["//tasks:data", "//proj:ranking"],
)
"""
    ),
    'tests/end_to_end_test.py': (
        'from proj.tasks.data import load\nfrom proj import ranking\n'
    ),
}


def _check_tree(root: Path, changes=()) -> list[str]:
  """Writes the good tree with (path, old, new) changes and checks it.

  old None writes `new` as the whole file; new None deletes the file.
  """
  tree = dict(_GOOD_TREE)
  for path, old, new in changes:
    if new is None:
      del tree[path]
    elif old is None:
      tree[path] = new
    else:
      assert old in tree[path], (path, old)
      tree[path] = tree[path].replace(old, new)
  for path, text in tree.items():
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
  return check_repository(
      root,
      package_dirs=_PACKAGE_DIRS,
      source_dirs=_SOURCE_DIRS,
      distributions=_DISTRIBUTIONS,
  )


def test_good_tree_has_no_problems(tmp_path):
  assert _check_tree(tmp_path) == []


@pytest.mark.parametrize(
    'changes,expected',
    [
        pytest.param(
            [('proj/BUILD', '"scores.py"]', '"scores.py", "gone.py"]')],
            ['//proj:scores: src proj/gone.py does not exist'],
            id='missing src',
        ),
        pytest.param(
            [('proj/extra.py', None, '')],
            ['proj/extra.py: in the srcs of no target of proj/BUILD'],
            id='file in no target',
        ),
        pytest.param(
            [('proj/BUILD', '"ranking.py", "_sort.py"', '"ranking.py"')],
            ['proj/_sort.py: in the srcs of no target of proj/BUILD'],
            id='relatively imported file in no target',
        ),
        pytest.param(
            [('proj/BUILD', '["scores.py"]', '["scores.py", "_sort.py"]')],
            [
                'proj/_sort.py: in the srcs of more than one target: '
                '//proj:scores, //proj:ranking'
            ],
            id='file in two targets',
        ),
        pytest.param(
            [(
                'tasks/prepare.py',
                None,
                'from . import data\nfrom proj import ranking\n',
            )],
            [
                'tasks/prepare.py:2: imports proj.ranking, but //proj:ranking'
                ' is not in the deps of //tasks:prepare'
            ],
            id='missing dep',
        ),
        pytest.param(
            [(
                'tasks/prepare.py',
                None,
                'from . import data\nimport proj.tasks\n',
            )],
            [
                'tasks/prepare.py:2: imports proj.tasks, but //tasks:tasks is'
                ' not in the deps of //tasks:prepare'
            ],
            id='missing dep on a package __init__',
        ),
        pytest.param(
            [(
                'tests/BUILD',
                '"//proj:ranking"]',
                '"//proj:ranking", "//proj:scores"]',
            )],
            [
                '//tests:end_to_end_test: dep "//proj:scores" is imported by'
                ' none of its srcs'
            ],
            id='stale dep',
        ),
        pytest.param(
            [('tasks/BUILD', '[":data"]', '[":data", ":nope"]')],
            ['//tasks:prepare: dep ":nope" names no target'],
            id='unknown label',
        ),
        pytest.param(
            [('tasks/BUILD', '[":data"]', '[":data", "//tasks:data"]')],
            ['//tasks:prepare: dep "//tasks:data" is listed twice'],
            id='dep listed twice',
        ),
        pytest.param(
            [(
                'proj/BUILD',
                'py_test(\n    name = "ranking_test",\n    size = "small",',
                'py_library(\n    name = "ranking_test",',
            )],
            [
                'proj/ranking_test.py: a test file in the srcs of '
                '//proj:ranking_test; test files belong to py_test targets'
            ],
            id='test file in a py_library',
        ),
        pytest.param(
            [
                ('proj/testing_util.py', None, ''),
                (
                    'proj/BUILD',
                    '["ranking_test.py"]',
                    '["ranking_test.py", "testing_util.py"]',
                ),
            ],
            [
                '//proj:ranking_test: src proj/testing_util.py of a py_test is'
                ' not a *_test.py file'
            ],
            id='non-test file in a py_test',
        ),
        pytest.param(
            [('tasks/BUILD', 'name = "prepare"', 'name = "prepare_main"')],
            [
                '//tasks:prepare_main: main tasks/prepare_main.py is not one of'
                ' its srcs'
            ],
            id='main not in srcs',
        ),
        pytest.param(
            [
                (
                    'tests/end_to_end_test.py',
                    None,
                    'from proj.tasks import prepare\n',
                ),
                (
                    'tests/BUILD',
                    '["//tasks:data", "//proj:ranking"]',
                    '["//tasks:prepare"]',
                ),
            ],
            [
                'tests/end_to_end_test.py:1: imports proj.tasks.prepare, which'
                ' is in py_binary //tasks:prepare; only a py_library can be'
                ' a dep'
            ],
            id='dep on a binary',
        ),
        pytest.param(
            [(
                'tasks/BUILD',
                'py_binary(',
                'py_library(name = "data")\n\npy_binary(',
            )],
            ['tasks/BUILD: more than one target is named "data"'],
            id='duplicate target name',
        ),
        pytest.param(
            [('BUILD', None, None)],
            [
                'BUILD: missing (the root and every source folder need a BUILD '
                'file)'
            ],
            id='no root BUILD',
        ),
        pytest.param(
            [('proj/scores.py', None, 'import numpy\nimport absl\n')],
            [
                'proj/scores.py:2: imports absl, but the deps of //proj:scores'
                ' name none of its distributions (absl_py), e.g.'
                ' "@pypi//absl_py"'
            ],
            id='missing third-party dep',
        ),
        pytest.param(
            [(
                'proj/BUILD',
                '"@pypi//numpy"',
                '"@pypi//numpy", "@pypi//pytest"',
            )],
            [
                '//proj:scores: dep "@pypi//pytest" is imported by none of its'
                ' srcs'
            ],
            id='stale third-party dep',
        ),
        pytest.param(
            [('proj/_sort.py', None, 'import not_installed\n')],
            [
                'proj/_sort.py:1: imports not_installed, which no installed '
                'distribution provides'
            ],
            id='unknown third-party module',
        ),
        pytest.param(
            [('proj/_sort.py', None, 'import proj.missing\n')],
            [
                'proj/_sort.py:1: imports proj.missing, which is no file of the'
                ' repository'
            ],
            id='import of a missing project module',
        ),
        pytest.param(
            [(
                'tests/end_to_end_test.py',
                None,
                (
                    'from proj import ranking\nfrom proj.tasks import data\n'
                    'from . import helper\n'
                ),
            )],
            [
                'tests/end_to_end_test.py:3: relative import outside a project '
                'package'
            ],
            id='relative import outside a package',
        ),
        pytest.param(
            [('proj/BUILD', '["ranking_test.py"]', 'glob(["*_test.py"])')],
            [
                (
                    'proj/BUILD:21: py_test: name, srcs, deps, main must be'
                    ' literals for this check to read them'
                ),
                'proj/ranking_test.py: in the srcs of no target of proj/BUILD',
            ],
            id='glob srcs',
        ),
        pytest.param(
            [
                ('proj/sub/BUILD', None, ''),
                ('proj/sub/x.py', None, ''),
                ('proj/BUILD', '"_sort.py"]', '"_sort.py", "sub/x.py"]'),
            ],
            ['//proj:ranking: src proj/sub/x.py belongs to package //proj/sub'],
            id='src in a subpackage',
        ),
    ],
)
def test_reports_each_problem(tmp_path, changes, expected):
  assert _check_tree(tmp_path, changes) == expected


@pytest.mark.parametrize(
    'changes',
    [
        pytest.param(
            [
                ('proj/BUILD', '"_sort.py"]', '"_sort.py", "sub/x.py"]'),
                ('proj/sub/x.py', None, ''),
            ],
            id='src in a subfolder without a BUILD file',
        ),
        pytest.param(
            [(
                'tasks/data.py',
                None,
                'from absl import logging\nfrom proj.scores import *\n',
            )],
            id='star import',
        ),
        pytest.param(
            [
                ('tasks/BUILD', '[":data"]', '["//tasks:data"]'),
                ('tasks/BUILD', '"@pypi//absl-py"', '"@pypi//absl_py:pkg"'),
            ],
            id='other label forms',
        ),
    ],
)
def test_accepts_variants(tmp_path, changes):
  assert _check_tree(tmp_path, changes) == []
