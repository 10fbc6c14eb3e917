"""Which epoch a pass streams: the rules of ``shardfeed._epochs``, without
torch or a server."""

from __future__ import annotations

from shardfeed._epochs import EpochPage, Started, choose_epoch, pass_token


def test_a_new_pass_is_the_next_epoch_unless_a_choice_was_made_since() -> None:
    # Nothing begun yet: the dataset's own epoch.
    assert choose_epoch(0, 0, None, token=1, worker_loaded=False) == 0
    # A pass of epoch 0 begun under this choice, complete or cut short
    # (break, limit_train_batches): the next pass is epoch 1.
    begun = Started(epoch=0, choice=0, token=1)
    assert choose_epoch(0, 0, begun, token=2, worker_loaded=False) == 1
    # set_epoch / load_state_dict since: what they chose, also an epoch
    # already streamed.
    assert choose_epoch(0, 1, begun, token=2, worker_loaded=False) == 0
    assert choose_epoch(5, 1, begun, token=2, worker_loaded=False) == 5
    # A copy ahead of the page (it advanced itself) is not sent back.
    assert choose_epoch(7, 0, begun, token=2, worker_loaded=False) == 7


def test_sibling_workers_of_one_pass_agree_and_a_loaded_worker_follows_its_state() -> None:
    first = pass_token(loader_seed=1234, passes=1, fresh=0)
    # The first sibling began epoch 3; the second, same loader iterator and
    # pass, streams epoch 3 too, not 4.
    begun = Started(epoch=3, choice=0, token=first)
    assert choose_epoch(3, 0, begun, token=pass_token(1234, 1, 0), worker_loaded=False) == 3
    # The loader's next iterator (a new seed), or a persistent worker's next
    # pass (one more pass), is the next epoch.
    assert choose_epoch(3, 0, begun, token=pass_token(99, 1, 0), worker_loaded=False) == 4
    assert choose_epoch(3, 0, begun, token=pass_token(1234, 2, 0), worker_loaded=False) == 4
    # StatefulDataLoader loaded a state into this worker's copy: it wins.
    assert choose_epoch(3, 0, begun, token=pass_token(99, 1, 0), worker_loaded=True) == 3
    # Outside a DataLoader worker, every pass has a token of its own.
    assert pass_token(None, 1, fresh=42) == 42


def test_the_page_is_shared_with_a_copy_made_from_its_pickle() -> None:
    owner = EpochPage()
    assert owner.started() is None and owner.completed() is None
    copy = EpochPage(owner.to_pickle())
    copy.set_started(4, 2, 77)
    copy.set_completed(4, 2)
    copy.set_worker_used()
    # In this process the copy owns a page of its own (only another process
    # maps the owner's): what a worker in another process writes is seen by
    # the owner through the mapping, tested end to end with DataLoaders.
    assert copy.started() == Started(4, 2, 77)
    assert copy.completed() == (4, 2)
    assert copy.worker_used()


def _hammer(page: EpochPage, offset: int, rounds: int) -> None:
    for i in range(rounds):
        value = offset + i
        page.set_started(value, value, value)
        page.set_worker_used()
        begun = page.started()
        assert begun is not None and begun.epoch == begun.choice == begun.token, begun


def _hammer_mapped(source: tuple[int, int, int, bytes], offset: int, rounds: int) -> None:
    _hammer(EpochPage(source), offset, rounds)


def test_workers_and_the_owner_updating_the_page_at_once_never_see_half_a_record() -> None:
    import multiprocessing

    owner = EpochPage()
    context = multiprocessing.get_context("forkserver")
    workers = [
        context.Process(target=_hammer_mapped, args=(owner.to_pickle(), offset, 5_000))
        for offset in (0, 1_000_000)
    ]
    for worker in workers:
        worker.start()
    _hammer(owner, 2_000_000, 5_000)
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0, "a worker read a torn record"
    begun = owner.started()
    assert begun is not None and begun.epoch == begun.choice == begun.token
