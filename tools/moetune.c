/* The `moetune` command: a thin dispatcher over the engine's library side.
 *
 *   moetune train RUN.yaml [--set key=value]...
 *   moetune init RUN.yaml [--set key=value]...   create base_model from base_model_init
 *   moetune profile RUN.yaml [--compare] [--steps N] [--set key=value]...
 *   moetune inspect CHECKPOINT_DIR
 *   moetune bench adam|gemm|step|staging|save|nvme [options]
 *   moetune --version      version, commit, build kind, backends, CPU features
 *
 * Exit codes: 0 success, 1 a run failed (the message says what and where),
 * 2 a bad command line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/config/config.h"

#include "base/fileio.h"
#include "engine/model/io/init_random.h"
#include "engine/model/io/inspect.h"
#include "engine/run/profile.h"
#include "engine/run/signals.h"
#include "engine/parallel/ranks.h"
#include "engine/run/train.h"
#include "engine/run/save.h"
#include "tools/build_info.h"
#include "tools/bench/adam_bench.h"
#include "tools/bench/gemm_bench.h"
#include "tools/bench/nvme_bench.h"
#include "tools/bench/save_bench.h"
#include "tools/bench/staging_bench.h"
#include "tools/bench/step_bench.h"
#include "tools/plan/plan_cmd.h"
#include "tools/text/prepare_cmd.h"
#include "tools/text/tokenize_cmd.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moetune <command> [args]\n"
            "\n"
            "       moetune --version\n"
            "\n"
            "commands:\n"
            "  train RUN.yaml [--set key=value]...  fine-tune as the run config says\n"
            "  init RUN.yaml [--set key=value]...   create the run's base_model from its\n"
            "                                       base_model_init config (random weights)\n"
            "  plan RUN.yaml [--hw NAME|FILE] [--json] [--set key=value]...\n"
            "                                       will it fit, how fast: the planner's choice of\n"
            "                                       what to keep, offload or recompute (needs only\n"
            "                                       config.json; exit 3 when infeasible)\n"
            "  profile RUN.yaml [--compare] [--steps N] [--set key=value]...\n"
            "                                       a few steps of the run with the staging pool's\n"
            "                                       report: pinned bytes, waste, copies, waits, experts\n"
            "                                       skipped (output_dir/staging/: CSV, SVG); --compare\n"
            "                                       runs compact, per_tensor and max_slot side by side\n"
            "  inspect CHECKPOINT_DIR               architecture, parameter counts, tensor sizes\n"
            "  prepare RUN.yaml [--set key=value]...\n"
            "                                       read and tokenize the run's datasets as train will and\n"
            "                                       print the counts (examples, tokens, trained, dropped)\n"
            "  tokenize MODEL_DIR [--chat | --format TYPE] [--no-special]\n"
            "                                       stdin lines (or JSONL rows of a dataset type) -> one\n"
            "                                       JSON line each: ids (and the labels, rendered text)\n"
            "  bench adam [--params N] [--threads T] [--json]\n"
            "                                       host AdamW vs this machine's memory ceiling\n"
            "  bench gemm [--backend cpu|cuda] [--json]\n"
            "  bench gemm --grouped [--backend cpu|cuda] [--geometry qwen3-30b-a3b|mixtral-8x7b|small]\n"
            "                                       matrix products vs the machine's peak\n"
            "  bench step [--layers N] [--link-gbps G] [--json] ...\n"
            "                                       training steps under keep_all / offload_all /\n"
            "                                       min_memory with throttled links\n"
            "  bench staging [--layers N] [--experts E] [--gbps G] [--json] ...\n"
            "                                       the staging modes moving a scaled-down MoE's weights\n"
            "                                       and gradients over throttled links\n"
            "  bench save [--scale K] [--dir DIR] [--repeats R] [--json]\n"
            "                                       a resumable checkpoint save against the disk's\n"
            "                                       write + fsync speed\n"
            "  bench nvme --dir DIR [--gib N] [--qd N] [--io auto|uring|psync]\n"
            "                                       the NVMe store vs the directory's raw O_DIRECT\n"
            "                                       rate at queue depth 1 and N\n");
}

static int fail(const mt_error_t *err) {
    fprintf(stderr, "moetune: error: %s\n", err->msg);
    return 1;
}

/* Parses RUN.yaml and the --set overrides that follow it. */
static int load_run_config(int argc, char **argv, eng_run_config_t *rc, mt_error_t *err) {
    if (argc < 1) {
        fprintf(stderr, "moetune: missing RUN.yaml\n");
        return 2;
    }
    if (eng_run_config_load(argv[0], rc, err) != MT_OK) return fail(err);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--set") == 0 && i + 1 < argc) a = argv[++i];
        else if (strncmp(a, "--set=", 6) == 0) a += 6;
        else {
            fprintf(stderr, "moetune: unexpected argument '%s' (expected --set key=value)\n", argv[i]);
            return 2;
        }
        if (eng_run_config_set(rc, a, err) != MT_OK) return fail(err);
    }
    if (eng_run_config_validate(rc, err) != MT_OK) return fail(err);
    return 0;
}

static bool path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Creates base_model from base_model_init when it does not exist at all. A
 * folder that exists is never written into: if it is broken, training says
 * what is missing instead of replacing it with random weights. */
static int ensure_base_model(const eng_run_config_t *rc, bool verbose, mt_error_t *err) {
    if (path_exists(rc->base_model)) {
        if (verbose) fprintf(stderr, "moetune: %s already exists; leaving it as it is\n", rc->base_model);
        return 0;
    }
    if (rc->base_model_init[0] == '\0') {
        if (!verbose) return 0; /* training reports the missing checkpoint itself */
        fprintf(stderr, "moetune: %s: base_model_init is not set; nothing to create\n", rc->source_path);
        return 1;
    }
    if (!verbose && eng_ranks_launched()) {
        /* every rank would create it at once, and a rank could read another's half-written files */
        fprintf(stderr,
                "moetune: %s: base_model %s does not exist and this is a rank of a multi-process job: create it "
                "first with `moetune init %s` (one process), then start the job\n",
                rc->source_path, rc->base_model, rc->source_path);
        return 1;
    }
    FILE *f;
    if (mt_fopen_regular(rc->base_model_init, "base_model_init", &f, err) != MT_OK) {
        mt_error_prefix(err, "%s: ", rc->source_path);
        return fail(err);
    }
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    fprintf(stderr, "moetune: creating %s with random weights from %s (seed %llu)\n", rc->base_model,
            rc->base_model_init, (unsigned long long)rc->seed);
    if (eng_checkpoint_init_random(rc->base_model, text, rc->seed, err) != MT_OK) return fail(err);
    return 0;
}

/* " (steps 8 to 16, resumed)" for a resumed run, "" otherwise. */
static const char *resumed_note(const eng_train_result_t *res, char *buf, size_t cap) {
    if (res->first_step == 0) return "";
    snprintf(buf, cap, " (steps %d to %d, resumed)", res->first_step + 1, res->steps_done);
    return buf;
}

/* "; eval_loss 1.234567 (ppl 3.4366) after step 16" when the run evaluated, "" otherwise. */
static const char *eval_note(const eng_train_result_t *res, char *buf, size_t cap) {
    if (!res->has_eval) return "";
    snprintf(buf, cap, "; eval_loss %.6f (ppl %.4f) after step %d", res->eval_loss, exp(res->eval_loss),
             res->eval_step);
    return buf;
}

static int cmd_train(int argc, char **argv) {
    char note[64], evn[96];
    eng_run_config_t rc;
    mt_error_t err = {0};
    int rcode = load_run_config(argc, argv, &rc, &err);
    /* before base_model_init may create anything */
    if (rcode == 0 && eng_run_check_paths(&rc, &err) != MT_OK) rcode = fail(&err);
    if (rcode == 0) rcode = ensure_base_model(&rc, false, &err);
    eng_ranks_t ranks = {0};
    if (rcode == 0 && eng_ranks_open(&ranks, &err) != MT_OK) rcode = fail(&err);
    if (rcode == 0) {
        eng_train_result_t res;
        if (eng_train_ranked(&rc, &ranks, &res, &err) != MT_OK) {
            rcode = fail(&err);
        } else if (res.stopped_by_signal) {
            /* 128 + the signal, as a shell reports a process the signal ended: scripts tell a
               stopped run (130 SIGINT, 143 SIGTERM) from a finished (0) or failed (1) one */
            if (res.rank == 0) printf("stopped by %s after step %d: checkpoint saved in %s; resume with --set "
                   "resume_from_checkpoint=true\n",
                   eng_signal_name(res.stopped_by_signal), res.steps_done, res.last_checkpoint);
            rcode = 128 + res.stopped_by_signal;
        } else if (res.rank > 0) {
            /* with several ranks rank 0 reports the job: the other ranks wrote nothing */
        } else if (res.model_saved) {
            printf("trained %d steps%s in %.1f s: loss %.4f -> %.4f%s; model saved in %s\n",
                   res.steps_done - res.first_step, resumed_note(&res, note, sizeof note), res.seconds,
                   res.first_loss, res.last_loss, eval_note(&res, evn, sizeof evn), rc.output_dir);
        } else {
            printf("trained %d steps%s in %.1f s: loss %.4f -> %.4f%s; save_final: false, so no final model "
                   "was written; %s/metrics.jsonl has the run's metrics%s\n",
                   res.steps_done - res.first_step, resumed_note(&res, note, sizeof note), res.seconds,
                   res.first_loss, res.last_loss, eval_note(&res, evn, sizeof evn), rc.output_dir,
                   res.checkpoints_saved > 0 ? " and its checkpoint-N directories the periodic saves" : "");
        }
    }
    /* after rank 0's report: closing waits for every rank (see eng_train_ranked) */
    fflush(stdout);
    if (ranks.k) eng_ranks_close(&ranks);
    eng_run_config_free(&rc);
    return rcode;
}

static int cmd_init(int argc, char **argv) {
    eng_run_config_t rc;
    mt_error_t err = {0};
    int rcode = load_run_config(argc, argv, &rc, &err);
    /* the run it prepares would be refused: create nothing for it */
    if (rcode == 0 && eng_run_check_paths(&rc, &err) != MT_OK) rcode = fail(&err);
    if (rcode == 0) rcode = ensure_base_model(&rc, true, &err);
    eng_run_config_free(&rc);
    return rcode;
}

static int cmd_profile(int argc, char **argv) {
    eng_profile_opts_t po = {.steps = 3, .compare = false, .out = stdout};
    /* --compare and --steps may come anywhere; the rest is RUN.yaml and --set */
    char **rest = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *rest);
    if (!rest) return 1;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--compare") == 0) {
            po.compare = true;
        } else if (strcmp(argv[i], "--steps") == 0 || strncmp(argv[i], "--steps=", 8) == 0) {
            const char *v = argv[i][7] == '=' ? argv[i] + 8 : i + 1 < argc ? argv[++i] : NULL;
            char *end = NULL;
            const long k = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || k < 1 || k > 100000) {
                fprintf(stderr, "moetune profile: --steps needs a positive number, got %s\n", v ? v : "nothing");
                free(rest);
                return 2;
            }
            po.steps = (int)k;
        } else {
            rest[n++] = argv[i];
        }
    }
    eng_run_config_t rc;
    mt_error_t err = {0};
    int rcode = load_run_config(n, rest, &rc, &err);
    free(rest);
    if (rcode == 0 && eng_ranks_launched()) {
        /* profiling is of one process: every rank would write the same output_dir/staging */
        fprintf(stderr, "moetune: profile runs in one process; start it without mpirun or torchrun\n");
        rcode = 1;
    }
    if (rcode == 0) rcode = ensure_base_model(&rc, false, &err);
    if (rcode == 0 && eng_profile(&rc, &po, &err) != MT_OK) rcode = fail(&err);
    eng_run_config_free(&rc);
    return rcode;
}

static int cmd_inspect(int argc, char **argv) {
    if (argc != 1) {
        fprintf(stderr, "usage: moetune inspect CHECKPOINT_DIR\n");
        return 2;
    }
    mt_error_t err = {0};
    if (eng_inspect(argv[0], stdout, &err) != MT_OK) return fail(&err);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "adam") == 0) return mt_bench_adam_main(argc, argv);
    if (argc >= 1 && strcmp(argv[0], "step") == 0) return mt_bench_step_main(argc, argv);
    if (argc >= 1 && strcmp(argv[0], "gemm") == 0) return mt_bench_gemm_main(argc, argv);
    if (argc >= 1 && strcmp(argv[0], "staging") == 0) return mt_bench_staging_main(argc, argv);
    if (argc >= 1 && strcmp(argv[0], "save") == 0) return mt_bench_save_main(argc, argv);
    if (argc >= 1 && strcmp(argv[0], "nvme") == 0) return mt_bench_nvme_main(argc, argv);
    fprintf(stderr, "usage: moetune bench adam|gemm|step|staging|save|nvme [options]\n");
    return 2;
}

int main(int argc, char **argv) {
    /* Under `bazel run` the process starts in the runfiles tree; paths on the
     * command line are meant relative to where the user typed them. */
    const char *wd = getenv("BUILD_WORKING_DIRECTORY");
    if (wd && chdir(wd) != 0) fprintf(stderr, "moetune: cannot enter %s\n", wd);
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        mt_build_info_print(stdout);
        return 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "init") == 0) return cmd_init(argc - 2, argv + 2);
    if (strcmp(cmd, "inspect") == 0) return cmd_inspect(argc - 2, argv + 2);
    if (strcmp(cmd, "profile") == 0) return cmd_profile(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return mt_plan_main(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0) return mt_tokenize_main(argc - 2, argv + 2);
    if (strcmp(cmd, "prepare") == 0) return mt_prepare_main(argc - 2, argv + 2);
    fprintf(stderr, "moetune: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
