/* Templates users select by name (`chat_template: chatml`) when a model
 * folder has none, or to train a base model on a chat format. */
#include <string.h>

#include "text/jinja/jinja.h"

static const struct {
    const char *name, *source;
} NAMED[] = {
    /* ChatML, as transformers wrote it for models without a template */
    {"chatml",
     "{% for message in messages %}"
     "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
     "{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    /* ChatML whose assistant turns are marked for the assistant-only loss */
    {"chatml_generation",
     "{% for message in messages %}"
     "{% if message['role'] == 'assistant' %}"
     "{{'<|im_start|>assistant\\n'}}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
     "{{'\\n'}}"
     "{% else %}"
     "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
     "{% endif %}"
     "{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
};

const char *text_template_named(const char *name) {
    for (size_t i = 0; name && i < sizeof NAMED / sizeof *NAMED; i++)
        if (strcmp(NAMED[i].name, name) == 0) return NAMED[i].source;
    return NULL;
}

const char *text_template_names(void) { return "chatml, chatml_generation"; }
