/* cmd_render.c — `lilac render` (placeholder until the chat renderer lands). */
#include "../util/common.h"
#include "commands.h"

int cmd_render(int argc, char **argv) {
    (void)argc;
    (void)argv;
    lilac_die("render: not built yet");
}
