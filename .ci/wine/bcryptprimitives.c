/*
 * A stand-in bcryptprimitives.dll for running Rust programs under Wine 8.0.
 *
 * Rust's standard library on Windows imports ProcessPrng from
 * bcryptprimitives.dll (Windows 10 and later); Wine 8.0 has no such DLL, so
 * every Rust program fails to start under it. This DLL exports ProcessPrng
 * and fills the buffer with RtlGenRandom (advapi32's SystemFunction036),
 * which Wine implements. CI only: never shipped.
 *
 * Build: x86_64-w64-mingw32-gcc -shared -O2 -o bcryptprimitives.dll \
 *            bcryptprimitives.c -ladvapi32
 */
#include <windows.h>

/* RtlGenRandom takes a ULONG length; fill larger buffers in pieces. */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
