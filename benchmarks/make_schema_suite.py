"""Not a measurement: writes `schema_suite.jsonl`, the held-out set of real-world JSON schemas that
`schema_suite.py` and tests/test_schema_suite.py read, from the packages that ship them.

    mkdir -p /tmp/schemas && cd /tmp/schemas
    pip download --no-deps -d . check-jsonschema==0.39.0 jupyterlab==4.6.6 nbformat==5.11.1 \
        poetry-core==2.5.0 validate-pyproject==0.27
    npm pack @jsonresume/schema@1.3.1
    python benchmarks/make_schema_suite.py /tmp/schemas [--out benchmarks/schema_suite.jsonl]

Sources (each line of the output keeps its package, version, path and license):
- SchemaStore's schemas vendored by check-jsonschema (CI configs, GitHub files, Read the Docs, ...);
- JupyterLab's settings schemas (one per plugin that has settings);
- the Jupyter notebook format (nbformat), Poetry's and validate-pyproject's pyproject schemas,
  JSON Resume's resume and job schemas.
A schema is dropped if its compact JSON is over MAX_CHARS (the file stays small), if it `$ref`s
another file or a URL (not resolvable here), or if jsonschema says it is not a valid schema; the
dropped ones are printed with the reason. Each line: {"id", "prompt", "schema", "source": {"package",
"version", "path", "license"}}. The prompt asks for an instance in plain words, as a user would.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

MAX_CHARS = 30_000

# (package, archive glob, path inside the archive (a regex), license)
SOURCES = [
    ("check-jsonschema", "check_jsonschema-*.whl", r"check_jsonschema/builtin_schemas/(vendor|custom)/[^/]+\.json",
     "SchemaStore schemas: Apache-2.0 (check-jsonschema vendors them; its own code: Apache-2.0)"),
    ("nbformat", "nbformat-*.whl", r"nbformat/v[34]/nbformat\.v[34]\.schema\.json", "BSD-3-Clause"),
    ("poetry-core", "poetry_core-*.whl", r"poetry/core/json/schemas/[^/]+-schema\.json", "MIT"),
    ("validate-pyproject", "validate_pyproject-*.whl", r"validate_pyproject/.*\.schema\.json", "MPL-2.0"),
    ("jupyterlab", "jupyterlab-*.whl", r"jupyterlab/schemas/@jupyterlab/[^/]+/[^/]+\.json", "BSD-3-Clause"),
    ("@jsonresume/schema", "jsonresume-schema-*.tgz", r"package/(job-)?schema\.json", "MIT"),
]

# the prompts of the non-JupyterLab schemas, by file name (JupyterLab's are made from the title)
PROMPTS = {
    "github-workflows-require-timeout.json": "Write a GitHub Actions workflow that runs the tests on every push, as JSON.",
    "bamboo-spec.json": "Write a realistic Bamboo CI build plan specification as JSON.",
    "changie.json": "Write a changie configuration for a Go project's changelog, as JSON.",
    "citation-file-format.json": "Write a CITATION.cff file for a small research software package, as JSON.",
    "cloudbuild.json": "Write a Google Cloud Build config that builds and pushes a Docker image, as JSON.",
    "codecov.json": "Write a codecov.yml configuration as JSON, with coverage targets for a Python project.",
    "github-actions.json": "Write the action.yml metadata of a composite GitHub Action that sets up a tool, as JSON.",
    "github-discussion.json": "Write a GitHub discussion category form template as JSON.",
    "github-issue-config.json": "Write a GitHub issue template chooser config (config.yml) as JSON.",
    "meltano.json": "Write a meltano.yml project file with one extractor and one loader, as JSON.",
    "readthedocs.json": "Write a .readthedocs.yaml configuration for a Sphinx project, as JSON.",
    "taskfile.json": "Write a Taskfile with build, test and lint tasks, as JSON.",
    "woodpecker-ci.json": "Write a Woodpecker CI pipeline that builds and tests a Node.js app, as JSON.",
    "nbformat.v3.schema.json": "Write a tiny Jupyter notebook (nbformat 3) with one code cell, as JSON.",
    "nbformat.v4.schema.json": "Write a tiny Jupyter notebook (nbformat 4) with a markdown cell and a code cell, as JSON.",
    "dependency-groups-schema.json": "Write the [dependency-groups] table of a pyproject.toml with test and docs groups, as JSON.",
    "poetry-schema.json": "Write the [tool.poetry] table of a pyproject.toml for a small CLI package, as JSON.",
    "project-schema.json": "Write the [project] table of a pyproject.toml for a small library, as JSON.",
    "distutils.schema.json": "Write a [tool.distutils] table of a pyproject.toml as JSON.",
    "setuptools.schema.json": "Write a [tool.setuptools] table of a pyproject.toml for a src-layout package, as JSON.",
    "project_metadata.schema.json": "Write the [project] metadata of a pyproject.toml for a web scraping library, as JSON.",
    "schema.json": "Write a JSON Resume for a junior backend developer.",
    "job-schema.json": "Write a job description for a senior data engineer position, in JSON Resume's job format.",
}


def _refs(node, out: set) -> set:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                out.add(v)
            else:
                _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)
    return out


def _members(archive: Path, inner: str) -> list[tuple[str, bytes]]:
    """(path, bytes) of the files of a wheel or an npm tarball whose path matches `inner`, by path."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return sorted((n, z.read(n)) for n in z.namelist() if re.fullmatch(inner, n))
    with tarfile.open(archive) as t:
        return sorted((m.name, t.extractfile(m).read()) for m in t.getmembers()
                      if m.isfile() and re.fullmatch(inner, m.name))


def _jupyterlab_prompt(schema: dict) -> str | None:
    props = schema.get("properties") or {}
    if not props or set(props) == {"toolbar"} and "toolbar" not in schema.get("title", "").lower():
        return None
    return f"Write my JupyterLab settings for the {schema['title']} plugin as a JSON object."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("downloads", help="a folder with the wheels and npm tarballs named in the docstring")
    ap.add_argument("--out", default=str(Path(__file__).with_name("schema_suite.jsonl")))
    args = ap.parse_args(argv)
    import jsonschema

    root, lines, dropped, seen_toolbar = Path(args.downloads), [], [], False
    for package, pattern, inner, license_ in SOURCES:
        archives = sorted(root.glob(pattern))
        if not archives:
            sys.exit(f"no {pattern} in {root}")
        archive = archives[-1]
        version = re.match(r"[^-]+-(?:schema-)?([0-9][^-]*?)(?:-py3.*)?(?:\.tgz|\.whl)$", archive.name).group(1)
        for path, data in _members(archive, inner):
            name = path.rsplit("/", 1)[1]
            schema = json.loads(data)
            text = json.dumps(schema, separators=(",", ":"))
            if package == "jupyterlab":
                prompt = _jupyterlab_prompt(schema)
                if prompt is None:
                    continue                   # a plugin without settings of its own
                if set(schema["properties"]) == {"toolbar"}:
                    if seen_toolbar:
                        continue               # the toolbar-only schemas are one schema, many times
                    seen_toolbar = True
                sid = "jupyterlab/" + path.split("@jupyterlab/")[1].replace(".json", "")
            else:
                prompt = PROMPTS.get(name)
                sid = f"{package.strip('@').split('/')[0]}/{name.replace('.schema.json', '').replace('.json', '')}"
            why = None
            outside = sorted(r for r in _refs(schema, set()) if not r.startswith("#"))
            if len(text) > MAX_CHARS:
                why = f"{len(text)} characters (over {MAX_CHARS})"
            elif outside:
                why = f"$ref outside the file: {outside[0]}"
            else:
                try:
                    jsonschema.validators.validator_for(schema).check_schema(schema)
                except jsonschema.SchemaError as e:
                    why = f"not a valid schema: {e.message[:80]}"
            if why is None and prompt is None:
                why = "no prompt written for it"
            if why:
                dropped.append((sid, why))
                continue
            lines.append({"id": sid, "prompt": prompt, "schema": schema,
                          "source": {"package": package, "version": version, "path": path, "license": license_}})
    Path(args.out).write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
    print(f"{len(lines)} schemas -> {args.out} ({Path(args.out).stat().st_size // 1024} KB); dropped {len(dropped)}:")
    for sid, why in dropped:
        print(f"  {sid}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
