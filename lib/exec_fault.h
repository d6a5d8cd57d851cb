/* Test hook (fault injection) for the executor, like pp_grow_fail_after
 * (grow.h): on the calling thread, the node run after the next n fails as
 * if its kernel had (n = 0: the very next node), once; n < 0 turns it off.
 * Returns how many nodes were still left of the previous setting (-1: none
 * planned), so a test can count the nodes a call runs and then fail each
 * of them in turn. */
#ifndef PIPPIN_EXEC_FAULT_H
#define PIPPIN_EXEC_FAULT_H

int pp_exec_fail_after_nodes(int n);

#endif
