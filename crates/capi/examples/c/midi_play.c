/*
 * A MIDI player: a C major scale onto a MIDI output — the virtual cable by default —
 * each note queued ahead of time and sent at its time by the output library's timer
 * thread, then a drain.
 *
 *   cc midi_play.c $(pkg-config --cflags --libs ictus) -o midi_play && ./midi_play cable:synth
 */
#include <stdint.h>

#include "check.h"

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "cable:synth";
    static const uint8_t scale[] = {60, 62, 64, 65, 67, 69, 71, 72};
    const uint64_t step = 20 * 1000 * 1000; /* 20 ms a note */

    ictus_midi_output *out;
    CHECK(ictus_midi_output_open(device, ICTUS_MIDI_TIMESHARING, &out));
    uint64_t start = ictus_midi_now_ns() + step;
    for (unsigned i = 0; i < sizeof scale; i++) {
        const uint8_t on[3] = {0x90, scale[i], 100};  /* note on, channel 1 */
        const uint8_t off[3] = {0x80, scale[i], 0};   /* note off */
        CHECK(ictus_midi_output_put(out, on, sizeof on, start + i * step));
        CHECK(ictus_midi_output_put(out, off, sizeof off, start + i * step + step / 2));
    }
    /* A message that is not MIDI is refused before it is queued. */
    const uint8_t junk[2] = {0x42, 0x42};
    ictus_error e = ictus_midi_output_put(out, junk, sizeof junk, start);
    printf("a stray data byte: %s\n", ictus_strerror(e));
    if (e != ICTUS_ERR_INVALID_ARGUMENT)
        return 1;

    ictus_midi_stats stats;
    CHECK(ictus_midi_output_close(out, ICTUS_MIDI_DRAIN, &stats));
    printf("played %llu messages (%llu bytes) on %s; %llu late\n", (unsigned long long)stats.sent,
           (unsigned long long)stats.bytes, device, (unsigned long long)stats.late);
    return stats.sent == 2 * sizeof scale ? 0 : 1;
}
