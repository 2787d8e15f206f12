package dev.idemd.client;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;

/**
 * The clock of a client's {@link LeaseKeeper}s: one daemon thread that extends the leases of the
 * handlers still running at half their lease.
 *
 * <p>Not a {@code ScheduledThreadPoolExecutor}: almost every handler ends long before half its
 * lease, and a scheduled task per execution made each one wake the scheduler thread (a new task at
 * the head of its queue signals it) and take the queue's lock twice, on the request's path: on two
 * busy cores one request in a thousand waited 8.5 ms for that lock behind a descheduled scheduler
 * thread.
 * Here starting and stopping a keeper is a set insertion and removal; the thread is woken only for
 * a keeper due before it would look anyway (a shorter lease than the ones before), and otherwise
 * sleeps until the earliest keeper is due, or a lease period when none runs.
 */
final class LeaseTimer {
  private static final AtomicInteger THREADS = new AtomicInteger();

  private final Set<LeaseKeeper> active = ConcurrentHashMap.newKeySet();
  private final Object startLock = new Object();
  /** {@link System#nanoTime()} at which the thread looks next; read by {@link #add}. */
  private volatile long plannedWake;
  /** The last period added: how long the thread sleeps when no keeper runs. */
  private volatile long idleNanos;
  private volatile boolean closed;
  private volatile Thread thread;

  /** Starts timing {@code keeper}; false when the client is closed. */
  boolean add(LeaseKeeper keeper) {
    if (closed) {
      return false;
    }
    idleNanos = keeper.periodNanos();
    active.add(keeper);
    Thread t = thread;
    if (t == null) {
      synchronized (startLock) {
        if (closed) {
          active.remove(keeper);
          return false;
        }
        if (thread == null) {
          t = new Thread(this::run, "idemd-lease-keeper-" + THREADS.incrementAndGet());
          t.setDaemon(true);
          thread = t;
          t.start();
          return true;
        }
        t = thread;
      }
    }
    if (keeper.due() - plannedWake < 0) {
      LockSupport.unpark(t);
    }
    return true;
  }

  void remove(LeaseKeeper keeper) {
    active.remove(keeper);
  }

  /** Stops the thread; keepers still running keep their current lease only. */
  void close() {
    synchronized (startLock) {
      closed = true;
    }
    active.clear();
    Thread t = thread;
    if (t != null) {
      LockSupport.unpark(t);
    }
  }

  private void run() {
    while (!closed) {
      long now = System.nanoTime();
      long next = now + idleNanos;
      for (LeaseKeeper keeper : active) {
        if (keeper.due() - now <= 0) {
          keeper.extend(now);
        }
        if (keeper.due() - next < 0) {
          next = keeper.due();
        }
      }
      plannedWake = next;
      // A keeper added while this thread looked compared its due time with the previous
      // plannedWake and may not have woken it: look once more before sleeping. (An add after the
      // write above sees the new plannedWake; its unpark is kept for the park below.)
      boolean earlier = false;
      for (LeaseKeeper keeper : active) {
        if (keeper.due() - next < 0) {
          earlier = true;
          break;
        }
      }
      if (!earlier) {
        LockSupport.parkNanos(this, next - System.nanoTime());
      }
    }
  }
}
