/* content_part.h — what a message content part is, decided once for both the
 * request validator (src/server/request.c) and the chat renderer (chat.c).
 *
 * The Qwen3.6 template classifies a part by its keys before its type: a part
 * with an "image" or "image_url" key (or type "image") renders as an image
 * placeholder, then "video" likewise, then one with a "text" key as text. A
 * validator that looked only at "type" would pass {"type":"text","text":...,
 * "image":...}, which renders vision special tokens in place of the text. */
#ifndef LILAC_CONTENT_PART_H
#define LILAC_CONTENT_PART_H

#include <jansson.h>

typedef enum {
    LILAC_PART_TEXT,    /* renders its "text" */
    LILAC_PART_IMAGE,   /* renders <|vision_start|><|image_pad|><|vision_end|> */
    LILAC_PART_VIDEO,   /* renders <|vision_start|><|video_pad|><|vision_end|> */
    LILAC_PART_OTHER,   /* the template raises "Unexpected item type in content." */
    LILAC_PART_INVALID, /* not an object, string or array: `'image' in item` fails */
} lilac_part_kind;

/* The template's view of one content part (the jinja `in` test on objects,
 * strings and arrays). */
lilac_part_kind lilac_content_part_kind(const json_t *part);

#endif
