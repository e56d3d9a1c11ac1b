//! What the BSD kernels' `sysctl(3)` answers mean, as pure functions of
//! the bytes they return, so that they are tested on any host: the start
//! of a process out of a `kinfo_proc`, a boot id out of its sysctl, and a
//! process's start on our clocks.

use super::ProcStart;

/// Where a `kinfo_proc` keeps what we read, in bytes from its start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// The whole structure's size: a reply of any other length is not one.
    pub(super) size: usize,
    /// Where the structure states its own size (FreeBSD's
    /// `ki_structsize`, an `int`), which must then equal the reply's
    /// length; `None` where it does not (macOS).
    pub(super) size_at: Option<usize>,
    /// The process id (`pid_t`, 32 bits).
    pub(super) pid_at: usize,
    /// The start, a `struct timeval`: `tv_sec` (`time_t`) ...
    pub(super) sec_at: usize,
    pub(super) sec_len: usize,
    /// ... and `tv_usec` (`suseconds_t`: 4 bytes on macOS, 8 on FreeBSD's
    /// 64-bit targets).
    pub(super) usec_at: usize,
    pub(super) usec_len: usize,
}

/// macOS's `struct kinfo_proc` on its 64-bit targets (x86_64 and arm64,
/// `<sys/sysctl.h>`): `kp_proc` (`struct extern_proc`) comes first, and
/// its first member is the union whose `p_starttime` (`struct timeval`:
/// a 64-bit `tv_sec`, a 32-bit `tv_usec`, padding) is at offset 0; then
/// two pointers, `p_flag` (`int`), `p_stat` (`char`) and `p_pid` at 40.
/// 648 bytes in all (`sizeof(struct kinfo_proc)`).
#[cfg(any(target_os = "macos", test))]
pub(super) const DARWIN_64: Layout = Layout {
    size: 648,
    size_at: None,
    pid_at: 40,
    sec_at: 0,
    sec_len: 8,
    usec_at: 8,
    usec_len: 4,
};

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// A signed integer of `len` (4 or 8) bytes at `at`, in this host's order.
fn read_int(bytes: &[u8], at: usize, len: usize) -> Option<i64> {
    match len {
        4 => read_i32(bytes, at).map(i64::from),
        8 => Some(i64::from_ne_bytes(
            bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
        )),
        _ => None,
    }
}

/// The start of process `pid` as `(tv_sec, tv_usec)`, from the reply of
/// `sysctl({CTL_KERN, KERN_PROC, KERN_PROC_PID, pid})`. `None` unless the
/// reply is one whole `kinfo_proc` of that very process (the kernel
/// returns no bytes for a pid that does not exist).
pub(super) fn kinfo_start(reply: &[u8], layout: Layout, pid: i32) -> Option<(i64, i64)> {
    if reply.len() != layout.size {
        return None;
    }
    if let Some(at) = layout.size_at
        && usize::try_from(read_i32(reply, at)?).ok()? != reply.len()
    {
        return None;
    }
    if read_i32(reply, layout.pid_at)? != pid {
        return None;
    }
    let sec = read_int(reply, layout.sec_at, layout.sec_len)?;
    let usec = read_int(reply, layout.usec_at, layout.usec_len)?;
    Some((sec, usec))
}

/// A `struct timeval` since the epoch in milliseconds; `None` for a
/// negative or zero time (the kernel's "never set") or an impossible
/// microsecond count.
pub(crate) fn timeval_ms(sec: i64, usec: i64) -> Option<u64> {
    if sec <= 0 || !(0..1_000_000).contains(&usec) {
        return None;
    }
    let sec = u64::try_from(sec).ok()?;
    let usec = u64::try_from(usec).ok()?;
    sec.checked_mul(1000)?.checked_add(usec / 1000)
}

/// A process that started at `start_ms` on the wall clock, seen when the
/// wall clock reads `wall_now_ms` and the boot clock `boot_now_ms`.
///
/// The kernel states the start on the wall clock (macOS: the wall clock
/// at `fork`; FreeBSD: the uptime at `fork` plus the boot time as it
/// stands now), so its age is "now minus the start" on the same clock,
/// and the start on the boot clock (`ticks`, in milliseconds: what the
/// record's `procStart` then holds) is the boot clock now minus that age.
/// A start later than now (the wall clock was set back since) has age 0.
pub(crate) fn start_from_wall(start_ms: u64, wall_now_ms: u64, boot_now_ms: u64) -> ProcStart {
    let age_ms = wall_now_ms.saturating_sub(start_ms);
    ProcStart {
        ticks: boot_now_ms.saturating_sub(age_ms),
        epoch_ms: start_ms,
        age_ms,
    }
}

/// pi-research's `startTime` for a start of `start_ms`: whole seconds since
/// the epoch, cut (not rounded), as `ps -o lstart=` shows the same
/// `kinfo_proc` field, which is where pi-research's process-lifecycle
/// service reads it off Linux.
pub(crate) fn start_time_s(start: &ProcStart) -> u64 {
    start.epoch_ms / 1000
}

/// macOS's `kern.bootsessionuuid`, a C string (a UUID made at boot);
/// `None` if it is empty or not printable ASCII.
#[cfg(any(target_os = "macos", test))]
pub(super) fn boot_session_uuid(reply: &[u8]) -> Option<String> {
    let text = reply.split(|&b| b == 0).next()?;
    let text = std::str::from_utf8(text).ok()?.trim();
    let printable = text.bytes().all(|b| b.is_ascii_graphic());
    (!text.is_empty() && text.len() <= 64 && printable).then(|| text.to_ascii_lowercase())
}

/// FreeBSD's `kern.boot_id`: 16 random bytes drawn once per boot, as a
/// UUID-shaped string; `None` unless exactly 16 bytes, not all zero.
#[cfg(any(target_os = "freebsd", test))]
pub(super) fn boot_id_bytes(reply: &[u8]) -> Option<String> {
    if reply.len() != 16 || reply.iter().all(|&b| b == 0) {
        return None;
    }
    let hex: String = reply.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn darwin_reply(pid: i32, sec: i64, usec: i32) -> Vec<u8> {
        let mut reply = vec![0xAA; DARWIN_64.size];
        reply[0..8].copy_from_slice(&sec.to_ne_bytes());
        reply[8..12].copy_from_slice(&usec.to_ne_bytes());
        reply[40..44].copy_from_slice(&pid.to_ne_bytes());
        reply
    }

    #[test]
    fn darwin_kinfo_proc_gives_the_start_of_that_pid_only() {
        let reply = darwin_reply(4242, 1_796_319_168, 123_456);
        assert_eq!(
            kinfo_start(&reply, DARWIN_64, 4242),
            Some((1_796_319_168, 123_456))
        );
        // Another process's structure, or none (a pid that is gone: the
        // kernel answers with zero bytes), or a cut or grown reply.
        assert_eq!(kinfo_start(&reply, DARWIN_64, 4243), None);
        assert_eq!(kinfo_start(&[], DARWIN_64, 4242), None);
        assert_eq!(kinfo_start(&reply[..647], DARWIN_64, 4242), None);
        let mut longer = reply.clone();
        longer.push(0);
        assert_eq!(kinfo_start(&longer, DARWIN_64, 4242), None);
    }

    #[test]
    fn a_self_sized_kinfo_proc_must_state_the_replys_size() {
        // FreeBSD's shape: ki_structsize first, a 64-bit tv_usec.
        let layout = Layout {
            size: 64,
            size_at: Some(0),
            pid_at: 8,
            sec_at: 16,
            sec_len: 8,
            usec_at: 24,
            usec_len: 8,
        };
        let mut reply = vec![0; 64];
        reply[0..4].copy_from_slice(&64i32.to_ne_bytes());
        reply[8..12].copy_from_slice(&77i32.to_ne_bytes());
        reply[16..24].copy_from_slice(&1_700_000_000i64.to_ne_bytes());
        reply[24..32].copy_from_slice(&999_999i64.to_ne_bytes());
        assert_eq!(kinfo_start(&reply, layout, 77), Some((1_700_000_000, 999_999)));
        reply[0..4].copy_from_slice(&1088i32.to_ne_bytes());
        assert_eq!(kinfo_start(&reply, layout, 77), None);
    }

    #[test]
    fn timevals_become_epoch_milliseconds() {
        assert_eq!(timeval_ms(1_796_319_168, 123_456), Some(1_796_319_168_123));
        assert_eq!(timeval_ms(1, 999_999), Some(1_999));
        for (sec, usec) in [(0, 0), (-5, 0), (10, -1), (10, 1_000_000), (i64::MAX, 0)] {
            assert_eq!(timeval_ms(sec, usec), None, "{sec} {usec}");
        }
    }

    #[test]
    fn a_wall_clock_start_maps_onto_age_and_boot_clock() {
        // Started 90 s ago; the boot clock reads 1000 s.
        let s = start_from_wall(1_700_000_000_000, 1_700_000_090_000, 1_000_000);
        assert_eq!(s.epoch_ms, 1_700_000_000_000);
        assert_eq!(s.age_ms, 90_000);
        assert_eq!(s.ticks, 910_000);
        // The wall clock set back since the start: no negative age.
        let s = start_from_wall(1_700_000_000_000, 1_699_999_000_000, 5_000);
        assert_eq!((s.age_ms, s.ticks), (0, 5_000));
        // Older than the boot clock (a boot clock that stopped in
        // suspend): the boot-clock start saturates at 0.
        assert_eq!(start_from_wall(0, 10_000, 5_000).ticks, 0);
    }

    #[test]
    fn pi_research_start_time_is_the_cut_second() {
        let s = start_from_wall(1_796_319_168_999, 1_796_319_170_000, 10_000);
        assert_eq!(start_time_s(&s), 1_796_319_168);
        // What `ps -o lstart=` prints for the same start, read back.
        assert_eq!(
            super::super::parse_lstart("Thu Dec  3 17:32:48 2026"),
            Some(start_time_s(&s))
        );
    }

    #[test]
    fn boot_ids_are_read_strictly() {
        assert_eq!(
            boot_session_uuid(b"0B5D0C3A-1B2C-4D5E-8F90-A1B2C3D4E5F6\0").as_deref(),
            Some("0b5d0c3a-1b2c-4d5e-8f90-a1b2c3d4e5f6")
        );
        assert_eq!(boot_session_uuid(b"\0"), None);
        assert_eq!(boot_session_uuid(b""), None);
        assert_eq!(boot_session_uuid(b"a b\0"), None);
        let bytes: Vec<u8> = (1..=16).collect();
        assert_eq!(
            boot_id_bytes(&bytes).as_deref(),
            Some("01020304-0506-0708-090a-0b0c0d0e0f10")
        );
        assert_eq!(boot_id_bytes(&[0; 16]), None);
        assert_eq!(boot_id_bytes(&bytes[..15]), None);
    }
}
