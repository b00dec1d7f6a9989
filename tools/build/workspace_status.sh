#!/bin/sh
# Bazel's --workspace_status_command (see .bazelrc): the git commit that
# stamped binaries print in `moetune --version`. STABLE_ keys rebuild the
# stamped targets only when they change. Outside a git checkout (a source
# tarball) the commit is "unknown" and the build goes on.
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=""
[ -n "$commit" ] || commit=unknown
if [ "$commit" != unknown ] && ! git diff --quiet HEAD 2>/dev/null; then commit="$commit-dirty"; fi
echo "STABLE_GIT_COMMIT $commit"
