/* json_brief.h — a JSON value in a few dozen characters, for error messages
 * ("expected an integer, found {...}"). */
#ifndef LILAC_JSON_BRIEF_H
#define LILAC_JSON_BRIEF_H
#include <jansson.h>
#include <stddef.h>

/* Writes "nothing (field absent)" for NULL, the compact JSON text otherwise,
 * cut to 45 characters + "..." when longer than 48. */
void json_brief(const json_t *v, char *buf, size_t cap);
#endif
