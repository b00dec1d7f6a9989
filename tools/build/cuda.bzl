"""cuda_library: compiles .cu files with nvcc into a cc_library.

Bazel 4.2.3 has no CUDA rules, so a small rule runs /usr/local/cuda/bin/nvcc
once per .cu file (see docs/building.md, "How the workspace is put together"
and "CUDA"):

  - every .cu is compiled with -fPIC and warnings as errors, for sm_80 and
    sm_90 (SASS) plus compute_90 PTX, so one binary runs on A100, H100/H200
    and, through the driver's JIT, on later GPUs;
  - the headers of `hdrs` and of every cc_library in `deps` are inputs of the
    nvcc action, so editing any of them recompiles the .cu (a genrule would
    need each header listed by hand);
  - the objects become the srcs of a cc_library that links the CUDA runtime,
    cuBLAS and cuBLASLt (@cuda//:cudart) and carries `deps` on.

Include paths: the workspace root (-I.) and the include dirs the deps
declare; nvcc adds the toolkit's own include/ and include/cccl itself.
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

# Targets: SASS for Ampere (sm_80) and Hopper (sm_90), PTX for compute_90.
CUDA_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

_BASE_FLAGS = [
    "-std=c++17",
    "-O2",
    "-Xcompiler=-fPIC,-Wall,-Wextra,-Werror",
    "-Werror=all-warnings",
    "-D_GNU_SOURCE",
]

def _cuda_objects_impl(ctx):
    cc = [d[CcInfo].compilation_context for d in ctx.attr.deps if CcInfo in d]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in cc])
    incs = depset(transitive = [c.includes for c in cc] + [c.quote_includes for c in cc])
    sys_incs = depset(transitive = [c.system_includes for c in cc])
    defines = depset(transitive = [c.defines for c in cc])
    outs = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(src.extension) - 1]
        out = ctx.actions.declare_file("_cuda_objs/%s/%s.o" % (ctx.label.name, stem))
        args = ctx.actions.args()
        args.add_all(_BASE_FLAGS)
        args.add_all(CUDA_GENCODE)
        args.add("-I.")
        args.add("-I" + ctx.bin_dir.path)
        args.add_all(incs, format_each = "-I%s")
        args.add_all(sys_incs, before_each = "-isystem")
        args.add_all(defines, format_each = "-D%s")
        args.add_all(ctx.attr.copts)
        args.add("-c", src)
        args.add("-o", out)
        ctx.actions.run(
            executable = _NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".cuh", ".h"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose srcs are .cu files compiled by nvcc.

    Args:
      name: the cc_library's name.
      srcs: .cu files (one object each).
      hdrs: .cuh/.h headers these .cu files include (private to the library).
      deps: cc_library targets whose headers the .cu files include; also
        linked into the library.
      copts: extra nvcc flags (e.g. "--fmad=false").
      visibility: of the cc_library.
      **kwargs: passed to the cc_library (tags, testonly, ...).
    """
    _cuda_objects(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        visibility = ["//visibility:private"],
        tags = kwargs.get("tags", []),
        testonly = kwargs.get("testonly", False),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_objs"],
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )
