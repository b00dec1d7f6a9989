/* What moetune writes, and how, so that nothing a user already has is lost
 * or overwritten:
 *
 * - Inputs are never outputs: eng_path_resolve gives the physical path of a
 *   path that may not exist yet (realpath of its nearest existing ancestor
 *   plus the rest), and eng_outdir_check_apart refuses an output directory
 *   that is, contains or lies inside an input.
 * - One run per output directory: eng_outdir_lock takes an advisory flock
 *   on DIR/.moetune.lock for the whole run and writes the holder's pid and
 *   command line into it, so a second run can say who holds it.
 * - Checkpoints switch in atomically (eng_ckpt_dir_*): the files are written
 *   into a fresh staging directory with a unique name, each fsync'd, then a
 *   completion manifest (moetune_complete.json: a save id, every file and its
 *   size) is written last and the result switched into place.  Every
 *   safetensors file carries the save id in its __metadata__, so a reader
 *   can tell a complete checkpoint from a mixed one; eng_ckpt_dir_check is
 *   the reader's side (weights files must match the manifest's id and size;
 *   other listed files must exist, so config.json stays editable by hand).
 *
 * Two ways to switch in, because a checkpoint is sometimes a directory of
 * its own and sometimes files among others:
 *   SWAP  (checkpoint-N, a new base_model): the staging directory is a
 *         sibling; commit renames it into place, exchanging it atomically
 *         with the previous one, which is deleted only after the switch.
 *   MERGE (the final model in output_dir, which also holds metrics.jsonl,
 *         trace.json, checkpoint-N/): staging is a hidden subdirectory; commit
 *         marks the directory as being written (moetune_writing.json), renames
 *         the files in, removes weights files of an earlier layout, renames
 *         the manifest in, then drops the mark.  A reader in between sees the
 *         mark, or a manifest whose save id does not match, and refuses; a
 *         crash in between is finished by the next run that takes the lock
 *         (eng_outdir_recover).  The final model keeps its documented paths
 *         (output_dir/model.safetensors, ...) this way. */
#ifndef MT_ENGINE_OUTDIR_H
#define MT_ENGINE_OUTDIR_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#define ENG_OUTDIR_LOCK_FILE ".moetune.lock"
#define ENG_CKPT_MANIFEST_FILE "moetune_complete.json"
#define ENG_CKPT_WRITING_FILE "moetune_writing.json"
/* The safetensors __metadata__ key holding the save id. */
#define ENG_CKPT_SAVE_ID_KEY "moetune_save_id"
/* Part of every staging / moved-aside name; what eng_outdir_recover removes. */
#define ENG_OUTDIR_TMP_TAG ".moetune-tmp-"

/* The absolute physical path of `path`, which need not exist: '.', '..' and
 * symlinks resolved as far as the path exists, the rest appended.  out gets
 * at most cap bytes. */
mt_status_t eng_path_resolve(const char *path, char *out, size_t cap, mt_error_t *err);

/* Refuses (MT_ERR_CONFIG) an output path that is, contains or lies inside
 * the input path; the message names both keys, both paths as given and as
 * resolved.  source names the run config for the message. */
mt_status_t eng_outdir_check_apart(const char *source, const char *out_key, const char *out_path,
                                   const char *in_key, const char *in_path, mt_error_t *err);

typedef struct {
    int fd; /* -1 when not held */
} eng_outdir_lock_t;

/* Creates DIR (mkdir -p) and locks DIR/.moetune.lock.  Held by another
 * process: MT_ERR_IO naming that process's pid and command line, with
 * nothing written. */
mt_status_t eng_outdir_lock(eng_outdir_lock_t *l, const char *dir, mt_error_t *err);
void eng_outdir_unlock(eng_outdir_lock_t *l);

/* Under the lock: finishes a MERGE switch a killed run left half done, puts
 * a complete checkpoint back under its name when a killed SWAP left the name
 * empty, and removes the other staging directories and moved-aside
 * checkpoints of runs that are gone.  note (may be NULL) receives a line for
 * the user when something was done. */
mt_status_t eng_outdir_recover(const char *dir, char *note, size_t note_cap, mt_error_t *err);

/* "<dir>/.<stem>.moetune-tmp-<pid>-<n>": unique per process and call. */
void eng_outdir_tmp_name(char *out, size_t cap, const char *dir, const char *stem);

typedef enum { ENG_CKPT_DIR_SWAP, ENG_CKPT_DIR_MERGE } eng_ckpt_dir_mode_t;

typedef struct {
    char *target;       /* where the checkpoint ends up */
    char *staging;      /* where its files are written until commit */
    char save_id[64];   /* stored in every safetensors file and the manifest */
    eng_ckpt_dir_mode_t mode;
    char **files;       /* (file_count) names written so far, in order */
    int file_count;
    long crash_at;      /* tests (MOETUNE_TEST_CRASH_AT): > 0 kills the process at that
                           write/switch point, counted over the process's saves */
} eng_ckpt_dir_t;

/* Creates the staging directory (and, for MERGE, target with mkdir -p). */
mt_status_t eng_ckpt_dir_begin(eng_ckpt_dir_t *tx, const char *target, eng_ckpt_dir_mode_t mode,
                               mt_error_t *err);
/* Where to write file `name` (malloc'ed). */
char *eng_ckpt_dir_path(const eng_ckpt_dir_t *tx, const char *name);
/* Records that `name` is complete in staging (written and fsync'd). */
void eng_ckpt_dir_add(eng_ckpt_dir_t *tx, const char *name);
/* Writes the manifest, fsyncs, switches in (see the file note).  On
 * error the target is as it was or refused by readers, never mixed
 * silently; tx is freed either way. */
mt_status_t eng_ckpt_dir_commit(eng_ckpt_dir_t *tx, mt_error_t *err);
/* Removes the staging directory and frees tx. */
void eng_ckpt_dir_abort(eng_ckpt_dir_t *tx);

/* A reader's check before loading DIR: a manifest must match the files
 * (sizes, save ids, the weights file a loader picks); without one, DIR
 * must not be marked as being written.  A directory with neither (an
 * ordinary Hugging Face checkpoint) passes.  Refusals are MT_ERR_FORMAT
 * naming the directory, the file and what to do. */
mt_status_t eng_ckpt_dir_check(const char *dir, mt_error_t *err);

#endif
