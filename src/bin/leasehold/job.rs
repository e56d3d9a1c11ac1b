//! Windows: the Job object `run` puts CMD in, in the place of Unix's
//! process group and watchdog. Created with
//! `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`, its only handle is the tool's:
//! when the tool exits or is killed (Task Manager, `taskkill /F`, a crash),
//! the kernel closes that handle and terminates every process of the job.
//! CMD starts suspended and is put in the job before its first instruction
//! runs, so every process it starts is in the job too (breaking away is not
//! allowed: `JOB_OBJECT_LIMIT_BREAKAWAY_OK` is not set).
//!
//! The only unsafe code of the tool on Windows; each block says why it is
//! sound.

#![allow(unsafe_code)]

use std::io;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};

use windows_sys::Win32::Foundation::{HANDLE, INVALID_HANDLE_VALUE};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JobObjectBasicAccountingInformation, JobObjectExtendedLimitInformation, QueryInformationJobObject,
    SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Threading::{
    CREATE_SUSPENDED, OpenThread, ResumeThread, THREAD_SUSPEND_RESUME,
};

/// A Job object whose processes die when it is dropped or the tool dies.
#[derive(Debug)]
pub(super) struct Job {
    handle: OwnedHandle,
}

impl Job {
    /// An unnamed job, whose handle is not inherited (nothing else can
    /// hold it open), that kills its processes when that handle closes.
    pub(super) fn new() -> io::Result<Self> {
        // SAFETY: both pointers may be null: no security attributes (the
        // handle is not inheritable), no name.
        let raw = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if raw.is_null() {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a valid handle just returned to us and owned by
        // nothing else; `OwnedHandle` closes it once.
        let handle = unsafe { OwnedHandle::from_raw_handle(raw) };
        let job = Self { handle };
        // SAFETY: an all-zero JOBOBJECT_EXTENDED_LIMIT_INFORMATION is valid
        // (plain integers and no limits).
        let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        // SAFETY: the handle is a live job handle; the pointer and size
        // describe `limits`, which outlives the call.
        let set = unsafe {
            SetInformationJobObject(
                job.raw(),
                JobObjectExtendedLimitInformation,
                (&raw const limits).cast(),
                size_of_u32::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>(),
            )
        };
        if set == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(job)
    }

    /// Starts `command` in the job: created suspended, put in the job,
    /// then resumed, so that nothing of it runs outside the job. The outer
    /// error is the tool's (the job could not take CMD; CMD is killed);
    /// the inner one says CMD could not be started.
    pub(super) fn spawn(
        &self,
        command: &mut tokio::process::Command,
    ) -> io::Result<io::Result<tokio::process::Child>> {
        command.creation_flags(CREATE_SUSPENDED);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return Ok(Err(e)),
        };
        let placed = match (child.raw_handle(), child.id()) {
            (Some(process), Some(pid)) => self.assign(process.cast()).and_then(|()| resume(pid)),
            _ => Err(io::Error::other("the command has no process handle")),
        };
        match placed {
            Ok(()) => Ok(Ok(child)),
            Err(e) => {
                // Suspended, it has run nothing yet.
                let _ = child.start_kill();
                Err(e)
            }
        }
    }

    fn assign(&self, process: HANDLE) -> io::Result<()> {
        // SAFETY: both handles are live: the job's is ours, the process's
        // belongs to the `Child` the caller holds for the whole call.
        if unsafe { AssignProcessToJobObject(self.raw(), process) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether no process of the job is running. A failed query counts as
    /// running: the lock is then held until the tool is stopped.
    pub(super) fn is_empty(&self) -> bool {
        let mut info = JOBOBJECT_BASIC_ACCOUNTING_INFORMATION::default();
        // SAFETY: the handle is a live job handle; the pointer and size
        // describe `info`, which outlives the call; the returned length may
        // be null.
        let ok = unsafe {
            QueryInformationJobObject(
                self.raw(),
                JobObjectBasicAccountingInformation,
                (&raw mut info).cast(),
                size_of_u32::<JOBOBJECT_BASIC_ACCOUNTING_INFORMATION>(),
                std::ptr::null_mut(),
            )
        };
        ok != 0 && info.ActiveProcesses == 0
    }

    /// Terminates every process of the job, each exiting with `code`. A
    /// failure means they are gone already, which the caller sees.
    pub(super) fn terminate(&self, code: u32) {
        // SAFETY: the handle is a live job handle.
        let _ = unsafe { TerminateJobObject(self.raw(), code) };
    }

    fn raw(&self) -> HANDLE {
        self.handle.as_raw_handle().cast()
    }
}

/// Resumes the threads of the suspended process `pid`: just created, it
/// has one, which Win32 does not hand back through `Command::spawn`, so it
/// is found in a snapshot of the system's threads.
fn resume(pid: u32) -> io::Result<()> {
    // SAFETY: no pointer is passed; the process id is ignored for
    // TH32CS_SNAPTHREAD.
    let raw = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) };
    if raw == INVALID_HANDLE_VALUE || raw.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a valid handle just returned to us, owned by nothing else.
    let owned = unsafe { OwnedHandle::from_raw_handle(raw) };
    let snapshot: HANDLE = owned.as_raw_handle().cast();
    let mut entry = THREADENTRY32 {
        dwSize: size_of_u32::<THREADENTRY32>(),
        ..THREADENTRY32::default()
    };
    let mut resumed = 0;
    // SAFETY: the snapshot handle is live (owned above); `entry` is a
    // THREADENTRY32 with its dwSize set, as both calls require.
    let mut more = unsafe { Thread32First(snapshot, &raw mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == pid {
            // SAFETY: no pointer is passed; a null return is checked.
            let thread = unsafe { OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID) };
            if thread.is_null() {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a valid handle just returned to us, owned by nothing
            // else, closed when dropped at the end of this block.
            let thread = unsafe { OwnedHandle::from_raw_handle(thread) };
            // SAFETY: a live thread handle opened with THREAD_SUSPEND_RESUME.
            if unsafe { ResumeThread(thread.as_raw_handle().cast()) } == u32::MAX {
                return Err(io::Error::last_os_error());
            }
            resumed += 1;
        }
        // SAFETY: as for Thread32First.
        more = unsafe { Thread32Next(snapshot, &raw mut entry) } != 0;
    }
    if resumed == 0 {
        return Err(io::Error::other("the command's thread was not found to resume"));
    }
    Ok(())
}

/// The size of `T` as the `u32` Win32 structures and calls take.
fn size_of_u32<T>() -> u32 {
    u32::try_from(std::mem::size_of::<T>()).unwrap_or(u32::MAX)
}
