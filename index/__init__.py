"""Gallery indexing and search with an exported ONNX embedder: LMDB storage, a faiss index beside it.

    build_index(vectors, target_recall=0.95)   the fastest faiss index of an array meeting a recall target, + report
    build_gallery(model, images, db, BuildOptions(...))  index a data set spec into a new gallery folder (resumable)
    add_images(db, images, IndexOptions(...))            add images to a gallery
    remove_items(db, ids=... | label=...)  remove items
    rebuild_index(db, index=None)          build the faiss index again from the stored embeddings
    edit_gallery(db, rebuild=False)        a gallery open for changes (writer lock held): add, remove; rebuilt first
    gallery_info(db) / verify_gallery(db)  what a gallery holds / whether LMDB, faiss and model agree
    evaluate_gallery(db)                   Recall@K, MAP@R, NMI of a labelled gallery through its index
    find_duplicates(db, threshold)         groups of near-duplicate items (edited copies), largest first
    Gallery.open(db).search(images_or_vectors, k)   thread-safe search; also thumbnail, info, labels, vectors
    search_threads(n)                      faiss's OpenMP threads set for a block, restored after

No torch and nothing from metricsearch.train is imported here.
"""

from metricsearch.index.autoindex import build_index
from metricsearch.index.catalog import Hit, Hits, SearchResults
from metricsearch.index.duplicates import draw_duplicates, find_duplicates
from metricsearch.index.evaluate import evaluate_gallery, labelled_items
from metricsearch.index.faiss_index import choose_index, select_device
from metricsearch.index.gallery import Gallery
from metricsearch.index.jobs import (Editor, JobSummary, add_images, build_gallery, edit_gallery, rebuild_index,
                                     remove_items)
from metricsearch.index.options import BuildOptions, IndexOptions
from metricsearch.index.pipeline import EmbedStep, ImageReader, ReadSettings
from metricsearch.index.threads import search_threads
from metricsearch.index.verify import gallery_info, verify_gallery

__all__ = ["BuildOptions", "Editor", "EmbedStep", "Gallery", "Hit", "Hits", "ImageReader", "IndexOptions", "JobSummary",
           "ReadSettings", "SearchResults", "add_images", "build_gallery", "build_index", "choose_index",
           "draw_duplicates", "edit_gallery", "evaluate_gallery", "find_duplicates", "gallery_info", "labelled_items",
           "rebuild_index", "remove_items", "search_threads", "select_device",
           "verify_gallery"]
