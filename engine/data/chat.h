/* Conversations of a chat_template dataset (see text.h and chat.c). */
#ifndef MT_ENGINE_DATA_CHAT_H
#define MT_ENGINE_DATA_CHAT_H

#include <jansson.h>

#include "engine/config/config.h"
#include "engine/data/text_encode.h"

/* One row: its messages rendered, encoded and labelled into *ex. */
mt_status_t eng_text_chat_row(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *row,
                              const char *where, eng_text_example_t *ex, mt_error_t *err);

#endif
