/* The evaluation split: which examples of the training data are held out
 * (axolotl's val_set_size), chosen from the run's seed alone so that a
 * rerun and a resume hold out the same ones.
 *
 * It works on example indices, not on what an example holds: today an
 * example is one row of the dataset (data.h), and eng_dataset_select copies
 * rows; once examples span several rows, only eng_dataset_select changes. */
#ifndef MT_ENGINE_DATA_SPLIT_H
#define MT_ENGINE_DATA_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/data/data.h"

/* Examples held out of num_examples: `size` in (0, 1) is a fraction,
 * ceil(size * num_examples) computed in double as datasets'
 * train_test_split does (axolotl's split); size >= 1 a whole count.  At
 * least one example must be left to train on. `key` names the setting in
 * messages. */
mt_status_t eng_split_count(int64_t num_examples, double size, const char *key, int64_t *n_eval, mt_error_t *err);

/* Which n_eval of num_examples are held out: a uniform choice drawn from
 * seed (its own stream, apart from the loader's shuffle of the same seed).
 * held (num_examples) is set true for the held-out ones. */
void eng_split_choose(int64_t num_examples, int64_t n_eval, uint64_t seed, bool *held);

/* out = the examples of ds whose held[i] == want, in their order (out is
 * new; ds is unchanged). */
void eng_dataset_select(const eng_dataset_t *ds, const bool *held, bool want, eng_dataset_t *out);

/* Splits *ds in place: *eval gets the held-out examples (eng_split_count,
 * eng_split_choose), *ds keeps the rest, both in their original order. */
mt_status_t eng_dataset_split(eng_dataset_t *ds, double size, uint64_t seed, const char *key, eng_dataset_t *eval,
                              mt_error_t *err);

/* Targets of ds that are trained on (!= -100): an evaluation set with none
 * has no loss. */
int64_t eng_dataset_counted(const eng_dataset_t *ds);

#endif
