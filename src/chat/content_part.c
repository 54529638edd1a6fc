/* content_part.c — see content_part.h. */
#include "content_part.h"

#include <stdbool.h>
#include <string.h>

/* jinja `'name' in item`; -1 when the test is undefined for item's type */
static int part_has(const json_t *item, const char *name, bool *yes) {
    *yes = false;
    if (json_is_object(item)) *yes = json_object_get(item, name) != NULL;
    else if (json_is_string(item))
        *yes = memmem(json_string_value(item), json_string_length(item), name, strlen(name)) != NULL;
    else if (json_is_array(item)) {
        for (size_t i = 0; i < json_array_size(item); i++) {
            const json_t *x = json_array_get(item, i);
            if (json_is_string(x) && json_string_length(x) == strlen(name) && !strcmp(json_string_value(x), name))
                *yes = true;
        }
    } else
        return -1;
    return 0;
}

static bool part_type_is(const json_t *item, const char *type) {
    const json_t *v = json_is_object(item) ? json_object_get(item, "type") : NULL;
    return v && json_is_string(v) && json_string_length(v) == strlen(type) && !strcmp(json_string_value(v), type);
}

lilac_part_kind lilac_content_part_kind(const json_t *item) {
    bool img, img_url, vid, txt;
    if (part_has(item, "image", &img)) return LILAC_PART_INVALID;
    part_has(item, "image_url", &img_url);
    if (img || img_url || part_type_is(item, "image")) return LILAC_PART_IMAGE;
    part_has(item, "video", &vid);
    if (vid || part_type_is(item, "video")) return LILAC_PART_VIDEO;
    part_has(item, "text", &txt);
    return txt ? LILAC_PART_TEXT : LILAC_PART_OTHER;
}
