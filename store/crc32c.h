/* CRC32C (Castagnoli), the checksum of every store extent.  The SSE4.2
 * crc32 instruction where the CPU has it (several GB/s, so checking what
 * is read costs little beside the disk), else a table
 * (one byte at a time); both give the same value. */
#ifndef MT_STORE_CRC32C_H
#define MT_STORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of n bytes at p, continuing from crc (0 to start). */
uint32_t mt_crc32c(uint32_t crc, const void *p, size_t n);
/* The same, always by the table (for tests comparing the two paths). */
uint32_t mt_crc32c_table(uint32_t crc, const void *p, size_t n);

#endif
