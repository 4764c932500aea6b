#!/usr/bin/env bash
# Builds the documentation site into build/site/ with mkdocs (Debian's mkdocs and
# mkdocs-material), strictly: a broken link between pages, a page missing from the tree or a
# bad nav entry fails the build. Before that it generates, into a staged copy of docs/:
#   reference/cli/*.md   one page per subcommand, from its --help (so it cannot drift);
# which needs the release build (build/bin; scripts/build.sh builds it if it is missing).
# Usage: scripts/docs.sh [--serve]   (--serve: preview on 127.0.0.1:8000 instead)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
if ! command -v mkdocs >/dev/null 2>&1; then scripts/setup.sh; fi
bin="$root/build/bin"
if [ ! -x "$bin/tessera" ]; then scripts/build.sh release >/dev/null; fi

stage="$root/build/docs-src"
rm -rf "$stage"
mkdir -p "$stage"
cp -r docs/. "$stage/"

# The command-line reference: `tessera help` lists the subcommands this build has.
cli="$stage/reference/cli"
{
  echo
  echo "| subcommand | what it does |"
  echo "|---|---|"
} >>"$cli/index.md"
"$bin/tessera" help | sed -n 's/^  \([a-z][a-z ]*[a-z]\)  \+\(.*\)$/\1\t\2/p' |
while IFS=$'\t' read -r words what; do
  page="${words// /-}.md"
  {
    echo "# tessera $words"
    echo
    echo "${what^}."
    echo
    echo '```'
    # shellcheck disable=SC2086
    "$bin/tessera" $words --help
    echo '```'
  } >"$cli/$page"
  echo "| [tessera $words]($page) | $what |" >>"$cli/index.md"
done

sed -e "s#^docs_dir: .*#docs_dir: $stage#" -e "s#^site_dir: .*#site_dir: $root/build/site#" \
  mkdocs.yml >"$root/build/mkdocs.yml"
if [ "${1:-}" = "--serve" ]; then
  exec mkdocs serve -f "$root/build/mkdocs.yml"
fi
mkdocs build --strict --quiet -f "$root/build/mkdocs.yml"
echo "docs: build/site/index.html"
