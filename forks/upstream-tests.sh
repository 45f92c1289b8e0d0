#!/usr/bin/env bash
# Upstream's own integration tests of every fork, stock beside fork: for each release named (all
# of forks/v*/ by default), the whole of its test/integration/servicecidr and
# test/integration/dualstack, run on the stock code and on the fork's by TestUpstreamIntegration
# (internal/kubeapiserverfork), which fails on any test whose result differs from stock's. Each
# release's table of every test and subtest, both sides, with their times, is written to
# internal/kubeapiserverfork/testdata/upstream-results-<release>.md.
#
#	forks/upstream-tests.sh                     # every release
#	forks/upstream-tests.sh v1.35.4 v1.36.3     # the releases named
#
# About 15 to 20 minutes per release on two cores, most of it the first build of the release's
# test binaries; the stock and fork kube-apiserver builds are not needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
releases=("$@")
if [ ${#releases[@]} -eq 0 ]; then
	for d in "$root"/forks/v*/; do releases+=("$(basename "$d")"); done
fi
status=0
for rel in "${releases[@]}"; do
	printf '\n== upstream tests of %s, stock beside fork (%s)\n' "$rel" "$(date -u +%H:%M:%S)"
	if ! (cd "$root/internal/kubeapiserverfork" &&
		CLUSTERIP_FORK_RELEASE=$rel \
		CLUSTERIP_FORK_UPSTREAM_TESTS=servicecidr,dualstack \
		CLUSTERIP_FORK_UPSTREAM_TABLE=$root/internal/kubeapiserverfork/testdata/upstream-results-$rel.md \
		GOWORK=off go test -v -timeout 120m -run '^TestUpstreamIntegration$' .); then
		echo "upstream tests of $rel: FAIL"
		status=1
	fi
done
exit $status
