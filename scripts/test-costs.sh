#!/usr/bin/env bash
# scripts/test-costs.sh [RELEASE_TREE [SANITIZED_TREE]] - the lines of tests/cost.cmake's table, from the
# times ctest kept in two build trees that ran the suite (Testing/Temporary/CTestCostData.txt; default
# build and build-asan, as scripts/test.sh leaves them): each test taking 2 s or more in either tree,
# longest first, seconds rounded up.  Paste the output over the table.
set -euo pipefail
cd "$(dirname "$0")/.."
rel=${1:-build}/Testing/Temporary/CTestCostData.txt
san=${2:-build-asan}/Testing/Temporary/CTestCostData.txt
for f in "$rel" "$san"; do
  [ -f "$f" ] || { echo "test-costs: $f missing: run ctest in that tree first" >&2; exit 1; }
done
# CTestCostData.txt: "name runs average_seconds" lines, then "---" and the failed tests
awk 'FNR == 1 { tree++ } /^---/ { nextfile } NF == 3 { t[$1, tree] = $3; names[$1] = 1 }
     END {
       for (n in names) {
         r = t[n, 1] + 0; s = t[n, 2] + 0
         if (r >= 2 || s >= 2) printf "  %-44s %5d %5d\n", n, int(r + 0.999), int(s + 0.999)
       }
     }' "$rel" "$san" | sort -k2,2nr -k3,3nr
