# Sourced by compare.sh, nostore.sh and shapes.sh (from the repository root, with $out
# set): build REV builds tb-parse as committed at REV (git archive: the
# checkout is not touched) into $out/tb-parse-REV and prints its path.
build() {
  local rev src
  rev=$(git rev-parse --short "$1")
  src=$(mktemp -d)
  git archive "$rev" | tar -x -C "$src"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -o "$OLDPWD/$out/tb-parse-$rev" ./cmd/tb-parse)
  rm -rf "$src"
  echo "$out/tb-parse-$rev"
}
