/* The one clock: CLOCK_MONOTONIC in seconds, for step times, traces,
 * calibration and benchmarks (never wall-clock time, which can jump). */
#ifndef MT_BASE_CLOCK_H
#define MT_BASE_CLOCK_H

double mt_now_s(void);

#endif
