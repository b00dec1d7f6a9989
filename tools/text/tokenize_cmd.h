/* `moetune tokenize MODEL_DIR [--chat] [--no-special]`: what training will
 * see, one input at a time (as llama.cpp's llama-tokenize is for its users).
 * Reads stdin: text lines, or with --chat JSONL conversations, and prints
 * one JSON line per input (see docs/commands.md). */
#ifndef MT_TOOLS_TEXT_TOKENIZE_CMD_H
#define MT_TOOLS_TEXT_TOKENIZE_CMD_H

/* argv[0] is the first argument after "tokenize"; returns the exit status. */
int mt_tokenize_main(int argc, char **argv);

#endif
